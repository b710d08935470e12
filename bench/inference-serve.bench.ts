// Serving benchmarks (docs/inference.md, "Figures"): the orchestrator's
// serving path (src/orchestrator/serving/completions.ts, in this process) driving a
// model cut into 2 stages served by single-thread processes on loopback
// (test/helpers/stage-server-child.ts: a miner's /infer without the rest of
// the miner), against one single-thread process generating the same requests
// alone.
//
//   inference.chain2.tokens_per_s.b8   8 concurrent generations through the 2 stage processes (f16 frames, 2 lanes: the default)
//   inference.chain2.lanes1.*          the same with every session in one frame per stage and step (no pipeline)
//   inference.chain2.ratio             that over the single-thread in-process Generator at batch 8
//   inference.bytes_per_token[.f32]    frame bytes sent and received by the orchestrator per generated token
//   inference.failover_ms              from the SIGKILL of a stage-1 replica to the next token of a stream it served
//
// The model is gpt-small (context 128, width 256, 6 blocks) with its training
// init: at gpt-tiny's size a step's compute is well under a millisecond and
// the comparison would measure HTTP round trips only.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { Engine } from '../src/engine/engine.ts';
import { Generator } from '../src/inference/generator.ts';
import { inferenceFromCheckpoint } from '../src/inference/load.ts';
import { encodeStage } from '../src/model/checkpoint.ts';
import { gptConfig, type GptConfig } from '../src/model/config.ts';
import { GptStage } from '../src/model/gpt.ts';
import { partCount, splitEvenly, type StageRange } from '../src/model/parts.ts';
import { mulberry32 } from '../src/model/init.ts';
import { Completions, type CompletionsOptions, parseCompletionRequest } from '../src/orchestrator/serving/completions.ts';
import type { Coordinator } from '../src/orchestrator/training/coordinator.ts';
import type { DeploymentRecord } from '../src/orchestrator/state/deployments.ts';
import type { Peer } from '../src/protocol/messages.ts';
import { domainOf } from '../src/protocol/network.ts';
import { SessionKey } from '../src/protocol/session-key.ts';
import { median, type Bench, type BenchResult } from './harness.ts';

const MODEL = 'gpt-small';
const SESSIONS = 8;
const PROMPT = 8;
const REPEATS = 5;
const CHILD = new URL('../test/helpers/stage-server-child.ts', import.meta.url).pathname;

interface Setup {
  dir: string;
  checkpoint: string;
  config: GptConfig;
  cuts: StageRange[];
  key: SessionKey;
  children: ChildProcess[];
}

/** A stage server in a child process; resolves with its peer once it listens. */
function spawnStage(s: Setup, stage: number, n: number): Promise<{ child: ChildProcess; peer: Peer }> {
  const id = `0x${n.toString(16).padStart(40, '0')}`;
  const args = { checkpoint: s.checkpoint, from: s.cuts[stage].from, to: s.cuts[stage].to, stage, stageCount: s.cuts.length, orchestratorKey: s.key.publicKey, domain: domainOf(s.key.publicKey), deploymentId: 'bench', maxSessions: 16, id };
  const child = spawn(process.execPath, ['--import', 'tsx', CHILD, JSON.stringify(args)], { stdio: ['ignore', 'pipe', 'inherit'] });
  s.children.push(child);
  return new Promise((resolve, reject) => {
    child.once('exit', (code) => reject(new Error(`stage server ${stage} exited (${code})`)));
    createInterface({ input: child.stdout! }).on('line', (line) => {
      try {
        const v = JSON.parse(line) as { event?: string; url?: string };
        if (v.event === 'listening' && v.url) resolve({ child, peer: { id, url: v.url, sessionKey: s.key.publicKey, weight: 1 } });
      } catch {
        // not JSON
      }
    });
  });
}

/** The orchestrator's side without the rest of an orchestrator: deployment `bench`, served by `replicas[stage]`. */
function coordinator(s: Setup, replicas: Peer[][]): { c: Coordinator; d: DeploymentRecord } {
  const d = { id: 'bench', name: MODEL, sha256: '0'.repeat(64), model: MODEL, status: 'serving', message: null, sessions: 16 } as unknown as DeploymentRecord;
  const c = {
    identity: { key: s.key, domain: domainOf(s.key.publicKey) },
    state: { deployments: { stages: () => s.cuts.map((r, i) => ({ stage: i, fromPart: r.from, toPart: r.to })) } },
    deployments: { servingPeers: (_id: string, stage: number) => replicas[stage], noteRequest: () => {} },
    log: () => {},
  } as unknown as Coordinator;
  return { c, d };
}

function prompt(i: number): number[] {
  const rng = mulberry32(1000 + i);
  return Array.from({ length: PROMPT }, () => Math.floor(rng() * 256));
}

const request = (i: number, maxTokens: number) => parseCompletionRequest({ model: MODEL, prompt: prompt(i), max_tokens: maxTokens, temperature: 0.8, seed: i });

/**
 * Tokens/s of SESSIONS concurrent generations through the chain, and frame
 * bytes per generated token, for each of `configs`: one warm-up run of each,
 * then `repeats` rounds that run each config once in turn (so that warming up
 * and the machine's noise fall on all alike); the median of each.
 */
async function chainRates<K extends string>(s: Setup, replicas: Peer[][], configs: Record<K, CompletionsOptions>, repeats: number): Promise<Record<K, { rate: number; bytesPerToken: number }>> {
  const { c, d } = coordinator(s, replicas);
  const keys = Object.keys(configs) as K[];
  const runs = keys.map((k) => {
    const completions = new Completions(c, configs[k]);
    const run = { completions, bytes: 0, rates: [] as number[], perToken: 0 };
    completions.observe({ stageStep: (st) => void (run.bytes += st.bytesSent + st.bytesReceived) });
    return run;
  });
  for (let r = 0; r < repeats + 1; r++) {
    for (const run of runs) {
      run.bytes = 0;
      const t0 = performance.now();
      const out = await Promise.all(Array.from({ length: SESSIONS }, (_, i) => run.completions.generate(d, request(i, s.config.contextLength - PROMPT))));
      const ms = performance.now() - t0;
      const tokens = out.reduce((n, o) => n + o.completionTokens, 0);
      if (r > 0) run.rates.push((tokens * 1000) / ms); // the first round warms up
      run.perToken = run.bytes / tokens;
    }
  }
  return Object.fromEntries(keys.map((k, i) => [k, { rate: median(runs[i].rates), bytesPerToken: runs[i].perToken }])) as Record<K, { rate: number; bytesPerToken: number }>;
}

/** Tokens/s of the same requests through one whole-model StageInference on a single-thread engine in this process. */
async function localRate(s: Setup, checkpoint: Uint8Array): Promise<number> {
  const engine = await Engine.create({ threads: 1 });
  try {
    const inf = inferenceFromCheckpoint(engine, checkpoint, undefined, { maxSessions: SESSIONS });
    const rates: number[] = [];
    for (let r = 0; r < REPEATS + 1; r++) {
      const g = new Generator([inf]);
      for (let i = 0; i < SESSIONS; i++) g.add({ prompt: prompt(i), maxTokens: s.config.contextLength - PROMPT, sampling: { temperature: 0.8, seed: i } });
      const t0 = performance.now();
      const done = g.runToEnd();
      const ms = performance.now() - t0;
      if (r > 0) rates.push((done.reduce((n, x) => n + x.sampledTokens, 0) * 1000) / ms);
    }
    inf.release();
    return median(rates);
  } finally {
    await engine.close();
  }
}

/**
 * ms from the SIGKILL of stage 1's first replica to the next token of the
 * slowest stream it served (the others go on). A stream's next token is its
 * first one after its failover: a token sampled from logits that came back
 * before the kill is not one the new replica served.
 */
async function failoverMs(s: Setup, stage0: Peer, stage1: { child: ChildProcess; peer: Peer }[]): Promise<number> {
  const { c, d } = coordinator(s, [[stage0], stage1.map((x) => x.peer)]);
  const completions = new Completions(c);
  const moved = new Set<string>();
  completions.observe({ failover: (f) => void moved.add(f.session) });
  const ids: string[] = [];
  const got: number[] = new Array(SESSIONS).fill(0);
  const firstAfter: number[] = new Array(SESSIONS).fill(0);
  let killedAt = 0;
  await Promise.all(Array.from({ length: SESSIONS }, (_, i) => completions.generate(d, request(i, 3 * s.config.contextLength), (b) => {
    got[i] += b.length;
    const now = performance.now();
    if (killedAt && !firstAfter[i] && moved.has(ids[i])) firstAfter[i] = now;
    if (!killedAt && got.every((n) => n >= 16)) {
      killedAt = now;
      stage1[0].child.kill('SIGKILL');
    }
  }, () => false, (id) => (ids[i] = id))));
  const affected = ids.map((id, i) => (moved.has(id) && firstAfter[i] ? firstAfter[i] - killedAt : -1)).filter((ms) => ms >= 0);
  if (!killedAt || affected.length === 0) throw new Error('no stream was on the killed replica');
  return Math.max(...affected);
}

export const inferenceServeBench: Bench = {
  group: 'inference',
  async run(o): Promise<BenchResult[]> {
    const config = gptConfig(MODEL);
    const dir = mkdtempSync(join(tmpdir(), 'nimble-serve-bench-'));
    const s: Setup = { dir, checkpoint: join(dir, 'model.safetensors'), config, cuts: splitEvenly(config, 2), key: SessionKey.generate(), children: [] };
    try {
      const engine = await Engine.create({ threads: 1 });
      const model = new GptStage(engine, config, { from: 0, to: partCount(config) }, { batchSize: 1, seed: 1 });
      const checkpoint = encodeStage(model);
      model.release();
      await engine.close();
      writeFileSync(s.checkpoint, checkpoint);
      o.log(`${MODEL} cut into 2 stages on 2 single-thread processes, ${SESSIONS} concurrent generations of ${config.contextLength - PROMPT} tokens`);
      const [a, b] = await Promise.all([spawnStage(s, 0, 1), spawnStage(s, 1, 2)]);
      const { f16, oneLane, f32 } = await chainRates(s, [[a.peer], [b.peer]], { f16: {}, oneLane: { lanesPerRoute: 1 }, f32: { codec: 'f32' } }, REPEATS);
      const local = await localRate(s, checkpoint);
      o.log(`one lane (every session in one frame per stage and step, no pipeline): ${oneLane.rate.toFixed(0)} tokens/s (${(oneLane.rate / local).toFixed(2)})`);
      o.log(`chain ${f16.rate.toFixed(0)} tokens/s, one process ${local.toFixed(0)} tokens/s (${(f16.rate / local).toFixed(2)}); ${f16.bytesPerToken.toFixed(0)} bytes/token in f16 frames, ${f32.bytesPerToken.toFixed(0)} in f32`);
      o.log('failover: a second stage-1 replica, the first killed with SIGKILL mid-generation (3 times)');
      // fresh processes: a miner's verifier takes at most 3,000 signed requests per sender in its 30 s
      // replay window (src/protocol/signing.ts), which the runs above come close to (docs/inference.md, "Not built yet")
      a.child.kill('SIGKILL');
      b.child.kill('SIGKILL');
      const times: number[] = [];
      for (let r = 0; r < 3; r++) {
        const [first, ...replicas] = await Promise.all([spawnStage(s, 0, 20 + 3 * r), spawnStage(s, 1, 21 + 3 * r), spawnStage(s, 1, 22 + 3 * r)]);
        times.push(await failoverMs(s, first.peer, replicas));
        first.child.kill('SIGKILL');
        replicas[1].child.kill('SIGKILL');
      }
      o.log(`failover: ${times.map((t) => t.toFixed(0)).join(', ')} ms`);
      return [
        { bench: 'inference.chain2.tokens_per_s.b8', value: Math.round(f16.rate), unit: 'tokens/s' },
        { bench: 'inference.chain2.ratio', value: Math.round((f16.rate / local) * 100) / 100, unit: 'x' },
        { bench: 'inference.chain2.lanes1.tokens_per_s.b8', value: Math.round(oneLane.rate), unit: 'tokens/s' },
        { bench: 'inference.chain2.lanes1.ratio', value: Math.round((oneLane.rate / local) * 100) / 100, unit: 'x' },
        { bench: 'inference.local.t1.tokens_per_s.b8', value: Math.round(local), unit: 'tokens/s' },
        { bench: 'inference.bytes_per_token', value: Math.round(f16.bytesPerToken), unit: 'bytes' },
        { bench: 'inference.bytes_per_token.f32', value: Math.round(f32.bytesPerToken), unit: 'bytes' },
        { bench: 'inference.failover_ms', value: Math.round(median(times)), unit: 'ms' },
      ];
    } finally {
      for (const child of s.children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    }
  },
};
