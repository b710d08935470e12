// Network benchmarks with real processes on loopback: pipeline efficiency of
// two single-thread miners against one two-thread process, bytes on the wire
// per trained token, and (with --convergence) the held-out loss of gpt-tiny
// trained by 4 miners as 2 stages x 2 replicas.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadCorpus } from '../src/data/corpus.ts';
import { Engine } from '../src/engine/engine.ts';
import { loadStageFrom } from '../src/model/checkpoint.ts';
import { gptConfig } from '../src/model/config.ts';
import { GptStage } from '../src/model/gpt.ts';
import { partCount } from '../src/model/parts.ts';
import { decodeSafetensors } from '../src/model/safetensors.ts';
import { startOrchestrator, type RunningOrchestrator } from '../src/orchestrator/server.ts';
import { Type } from '@sinclair/typebox';
import { generatePrivateKey } from 'viem/accounts';
import { OrchestratorClient } from '../src/api/client.ts';
import type { CreateRunRequest, RunView } from '../src/api/schemas.ts';
import { childEnv } from '../src/protocol/child-env.ts';
import { parseJson } from '../src/protocol/messages.ts';
import { heldoutLoss } from '../src/train/local.ts';
import { gptChild } from './engine.bench.ts';
import { median, type Bench, type BenchResult } from './harness.ts';

const MAIN = new URL('../src/cli/main.ts', import.meta.url).pathname;

/**
 * The 4-miner convergence run (docs/network.md, "Convergence"): the same
 * 1.536 M tokens and the same global batch as the single-process reference
 * (12 rows = 2 replicas x 6), so each replica takes 2,000 inner steps;
 * inner lr 2e-3, merges every 100 inner steps with plain averaging (outer lr 1,
 * momentum 0). NIMBLE_BENCH_RUN='{"lr": ...}' overrides any of it.
 */
export const CONVERGENCE_RUN = { batchSize: 6, steps: 4000, lr: 2e-3, outerLr: 1, outerMomentum: 0 };

/** An orchestrator in this process and miner child processes, on 127.0.0.1. */
export interface Net {
  orch: RunningOrchestrator;
  /** the developer's client (its runs, their checkpoints) */
  api: OrchestratorClient;
  children: ChildProcess[];
  dir: string;
}

export async function startNet(miners: { threads: number; throttle?: number }[]): Promise<Net> {
  const dir = mkdtempSync(join(tmpdir(), 'nimble-bench-'));
  const orch = await startOrchestrator({ dataDir: join(dir, 'orch') });
  const children = miners.map((m, i) =>
    spawn(process.execPath, ['--import', 'tsx', MAIN, 'miner', 'start', '--orchestrator', orch.url, '--name', `m${i}`, '--threads', String(m.threads), '--throttle', String(m.throttle ?? 1)], {
      env: childEnv({ NIMBLE_HOME: join(dir, `m${i}`) }),
      stdio: 'ignore',
    }),
  );
  return { orch, children, dir, api: new OrchestratorClient(orch.url, { wallet: generatePrivateKey() }) };
}

export async function stopNet(net: Net): Promise<void> {
  await Promise.all(
    net.children.map((c) => new Promise<void>((resolve) => {
      if (c.exitCode !== null || c.signalCode !== null) return resolve();
      c.once('exit', () => resolve());
      c.kill('SIGTERM');
    })),
  );
  await net.orch.close();
  rmSync(net.dir, { recursive: true, force: true });
}

async function createRun(net: Net, body: CreateRunRequest): Promise<string> {
  return (await net.api.createRun(body)).id;
}

function view(net: Net, id: string): Promise<RunView> {
  return net.api.run(id);
}

async function waitFor(net: Net, id: string, pred: (v: RunView) => boolean, log?: (v: RunView) => void): Promise<RunView> {
  let last = 0;
  for (;;) {
    const v = await view(net, id);
    if (log && performance.now() - last > 15_000) {
      last = performance.now();
      log(v);
    }
    if (pred(v)) return v;
    if (v.status === 'failed') throw new Error(`run failed: ${v.message}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/**
 * Tokens/s of two single-thread miners holding one stage each, in steady
 * state: the median of the rates over windows of 20 microbatches after the
 * first 20 (the machine is shared; a median ignores a window someone else
 * took).
 */
export async function pipelineTokensPerSecond(steps: number): Promise<number> {
  const net = await startNet([{ threads: 1 }, { threads: 1 }]);
  try {
    const id = await createRun(net, { model: 'gpt-tiny', data: 'moby-dick', steps, stages: 2, mergeEvery: 1_000_000, minMiners: 2 });
    const window = 20;
    const rates: number[] = [];
    let mark = await waitFor(net, id, (v) => v.microbatchesDone >= window);
    let t0 = performance.now();
    while (mark.microbatchesDone + window <= steps - 10) {
      const next = mark.microbatchesDone + window;
      const v = await waitFor(net, id, (x) => x.microbatchesDone >= next);
      const t = performance.now();
      rates.push(((v.tokensDone - mark.tokensDone) * 1000) / (t - t0));
      mark = v;
      t0 = t;
    }
    return median(rates);
  } finally {
    await stopNet(net);
  }
}

export const networkBenches: Bench[] = [
  {
    group: 'network',
    async run(o): Promise<BenchResult[]> {
      o.log('one process, 2 threads: gpt-tiny training speed');
      const single = gptChild('speed', 40).tokensPerSecond as number;
      o.log(`${Math.round(single)} tokens/s; now 2 single-thread miners, 2 stages`);
      const pipe = await pipelineTokensPerSecond(300);
      o.log(`${Math.round(pipe)} tokens/s through the pipeline`);
      o.log('4 miners, 2 stages x 2 replicas, default merge interval: bytes on the wire');
      const net = await startNet([{ threads: 1 }, { threads: 1, throttle: 0.8 }, { threads: 1, throttle: 0.6 }, { threads: 1, throttle: 0.45 }]);
      let bytesPerToken: number;
      try {
        const id = await createRun(net, { model: 'gpt-tiny', data: 'moby-dick', steps: 500, stages: 2, minMiners: 4 });
        const done = await waitFor(net, id, (v) => v.status === 'completed');
        bytesPerToken = done.bytesSent / done.tokensDone;
        o.log(`${done.bytesSent} bytes for ${done.tokensDone} tokens, ${done.mergesDone} merge rounds`);
      } finally {
        await stopNet(net);
      }
      return [
        { bench: 'network.pipeline2.efficiency', value: Number((pipe / single).toFixed(3)), unit: 'ratio' },
        { bench: 'network.pipeline2.tokens_per_s', value: Math.round(pipe), unit: 'tokens/s' },
        { bench: 'network.bytes_per_token', value: Number(bytesPerToken.toFixed(1)), unit: 'bytes/token' },
      ];
    },
  },
  {
    group: 'network-convergence',
    convergence: true,
    async run(o): Promise<BenchResult[]> {
      const recipe = { ...CONVERGENCE_RUN, ...parseJson(Type.Record(Type.String(), Type.Number()), process.env.NIMBLE_BENCH_RUN ?? '{}', 'NIMBLE_BENCH_RUN') };
      o.log(`gpt-tiny, 4 miners as 2 stages x 2 replicas, ${recipe.steps} microbatches of ${recipe.batchSize} x 64 = ${((recipe.steps * recipe.batchSize * 64) / 1e6).toFixed(3)} M tokens; run options ${JSON.stringify(recipe)}`);
      const net = await startNet([{ threads: 1 }, { threads: 1 }, { threads: 1 }, { threads: 1 }]);
      let bytes: Uint8Array;
      try {
        const id = await createRun(net, { model: 'gpt-tiny', data: 'moby-dick', stages: 2, minMiners: 4, ...recipe });
        await waitFor(net, id, (v) => v.status === 'completed', (v) => o.log(`${v.microbatchesDone}/${recipe.steps} loss ${v.loss?.toFixed(4)} ${Math.round(v.tokensPerSecond)} tok/s merges ${v.mergesDone}`));
        bytes = await net.api.checkpoint(id);
      } finally {
        await stopNet(net);
      }
      const engine = await Engine.create();
      try {
        const config = gptConfig('gpt-tiny');
        const model = new GptStage(engine, config, { from: 0, to: partCount(config) }, { batchSize: 12 });
        loadStageFrom(model, decodeSafetensors(bytes));
        const loss = heldoutLoss(model, loadCorpus('moby-dick'), 200, 12);
        model.release();
        return [{ bench: 'network.heldout_loss', value: loss, unit: 'nats/byte' }];
      } finally {
        await engine.close();
      }
    },
  },
];
