// nbcli up: a whole local network in one command: an orchestrator, N miner
// child processes of different speeds, a gpt-tiny run on Moby Dick, progress,
// and at the end the held-out loss and a generated sample.
import { spawn, type ChildProcess } from 'node:child_process';
import { createWriteStream, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import type { Command } from 'commander';
import { loadCorpus } from '../data/corpus.ts';
import { Engine } from '../engine/engine.ts';
import { loadStageFrom } from '../model/checkpoint.ts';
import { gptConfig } from '../model/config.ts';
import { bytesToText, generateBytes } from '../model/generate.ts';
import { GptStage, partCount } from '../model/gpt.ts';
import { decodeSafetensors } from '../model/safetensors.ts';
import { startOrchestrator } from '../orchestrator/server.ts';
import type { RunView } from '../orchestrator/views.ts';
import { heldoutLoss } from '../train/local.ts';
import { emit, parsePositiveInt, resolveDataDir, UserError, withCommonOptions, type CommonOptions } from './common.ts';
import { describeRun, followRun, postJson } from './follow.ts';
import { waitForSignal } from './orchestrator.ts';
import { nbcliArgv } from './self.ts';

interface Flags extends CommonOptions {
  miners: string;
  steps?: string;
  stages: string;
  model: string;
  mergeEvery?: string;
  evalBatches: string;
}

/** Throttles of the demo miners, so the network is heterogeneous. */
const THROTTLES = [1, 0.8, 0.6, 0.45, 0.9, 0.7, 0.5, 0.35];
const DEFAULT_STEPS = 2000;

export function registerUp(program: Command): void {
  withCommonOptions(
    program
      .command('up')
      .description('start a local network (orchestrator + miners) and train gpt-tiny on Moby Dick')
      .option('--miners <n>', 'miner child processes', '4')
      .option('--steps <n>', `microbatches to train; exit when done (without: ${DEFAULT_STEPS}, then keep serving until Ctrl+C)`)
      .option('--stages <n>', 'pipeline stages', '2')
      .option('--model <name>', 'model config', 'gpt-tiny')
      .option('--merge-every <h>', 'inner steps per replica between merges')
      .option('--eval-batches <n>', 'held-out batches for the final loss', '200'),
  ).action(async (flags: Flags) => {
    const minerCount = parsePositiveInt('--miners', flags.miners, 4);
    const steps = parsePositiveInt('--steps', flags.steps, DEFAULT_STEPS);
    const stages = parsePositiveInt('--stages', flags.stages, 2);
    const evalBatches = parsePositiveInt('--eval-batches', flags.evalBatches, 200);
    const config = gptConfig(flags.model);
    if (stages > minerCount) throw new UserError(`--stages ${stages} needs at least ${stages} miners`);
    const root = join(resolveDataDir(flags), 'up');
    const say = (event: Record<string, unknown>, human: string): void => emit(flags, event, () => human);
    const orch = await startOrchestrator({ dataDir: join(root, 'orchestrator'), port: 0 });
    say({ event: 'orchestrator', url: orch.url }, `orchestrator on ${orch.url} (state in ${join(root, 'orchestrator')})`);
    const children: ChildProcess[] = [];
    let stopping = false;
    const stopAll = async (): Promise<void> => {
      stopping = true;
      await Promise.all(
        children.map(
          (c) =>
            new Promise<void>((resolve) => {
              if (c.exitCode !== null || c.signalCode !== null) return resolve();
              c.once('exit', () => resolve());
              c.kill('SIGTERM');
              setTimeout(() => c.kill('SIGKILL'), 10_000).unref();
            }),
        ),
      );
      await orch.close();
    };
    const onSignal = (): void => void stopAll().then(() => process.exit(130));
    process.once('SIGINT', onSignal);
    try {
      mkdirSync(join(root, 'logs'), { recursive: true });
      const threads = Math.max(1, Math.floor(2 / Math.max(1, Math.ceil(minerCount / 2))));
      for (let i = 0; i < minerCount; i++) {
        const name = `miner-${i + 1}`;
        const throttle = THROTTLES[i % THROTTLES.length];
        const [cmd, ...pre] = nbcliArgv();
        const child = spawn(cmd, [...pre, 'miner', 'start', '--orchestrator', orch.url, '--data-dir', join(root, 'miners', name), '--name', name, '--threads', String(threads), '--throttle', String(throttle)], {
          stdio: ['ignore', 'pipe', 'pipe'],
          env: { ...process.env, NIMBLE_HOME: join(root, 'miners', name) },
        });
        const log = createWriteStream(join(root, 'logs', `${name}.log`));
        child.stdout!.pipe(log);
        child.stderr!.pipe(log);
        child.once('exit', (code, signal) => {
          if (!stopping) process.stderr.write(`${name} exited (${signal ?? code})\n`);
        });
        children.push(child);
        say({ event: 'miner', name, throttle, pid: child.pid }, `started ${name} (throttle ${throttle}, ${threads} thread${threads > 1 ? 's' : ''}, log ${join(root, 'logs', `${name}.log`)})`);
      }
      const run = await postJson<RunView>(orch.url, '/runs', {
        model: flags.model,
        data: 'moby-dick',
        steps,
        stages,
        minMiners: minerCount,
        ...(flags.mergeEvery ? { mergeEvery: parsePositiveInt('--merge-every', flags.mergeEvery, 50) } : {}),
      });
      say({ event: 'run', id: run.id }, `run ${run.id}: ${flags.model} on moby-dick, ${steps} steps of ${run.batchSize}×${config.contextLength} tokens, ${stages} stages`);
      const done = await followRun(orch.url, run.id, Boolean(flags.json));
      if (done.status !== 'completed') throw new Error(`run ${done.id} ${done.status}: ${done.message ?? ''}`);
      const res = await fetch(`${orch.url}/runs/${run.id}/checkpoint`);
      if (!res.ok) throw new Error(`cannot download the checkpoint: ${res.status}`);
      const bytes = new Uint8Array(await res.arrayBuffer());
      const ckpt = join(root, `${run.id}.safetensors`);
      const { writeFileSync } = await import('node:fs');
      writeFileSync(ckpt, bytes);
      const engine = await Engine.create();
      try {
        const model = new GptStage(engine, config, { from: 0, to: partCount(config) }, { batchSize: 12 });
        loadStageFrom(model, decodeSafetensors(bytes));
        const loss = heldoutLoss(model, loadCorpus('moby-dick'), evalBatches, 12);
        const prompt = new TextEncoder().encode('Call me Ishmael. ');
        const sample = bytesToText(prompt) + bytesToText(generateBytes(model, prompt, { length: 200, seed: 1 }));
        say(
          { event: 'done', id: run.id, heldoutLoss: loss, checkpoint: ckpt, sample, tokensDone: done.tokensDone, mergesDone: done.mergesDone, bytesSent: done.bytesSent },
          `${describeRun(done)}\nheld-out loss ${loss.toFixed(4)} nats/byte (${evalBatches} batches)\ncheckpoint: ${ckpt}\nsample:\n${sample}`,
        );
        model.release();
      } finally {
        await engine.close();
      }
      if (flags.steps === undefined) {
        say({ event: 'serving' }, 'the network keeps serving; Ctrl+C stops every process');
        await waitForSignal();
      }
    } finally {
      process.off('SIGINT', onSignal);
      if (!stopping) await stopAll();
    }
  });
}
