// The orchestrator's serving path (src/orchestrator/serving/completions.ts and
// stage-lanes.ts) against real serving stages in this process
// (test/helpers/stage-server.ts: the miner's /infer routes on their own
// servers): gpt-micro cut into 2 stages, 2 replicas each. The text always
// equals generateCached cut the same way, with the activations rounded as the
// frames round them: f16 frames by default, f32 on request; concurrent
// generations share each step's frames and each keeps its own text; a replica
// dropped mid-stream is failed over with a replay and the texts do not
// change; a miner refusing our request is not replayed elsewhere, and
// failovers are bounded.
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, test } from 'node:test';
import { Engine } from '../../../src/engine/engine.ts';
import { roundToF16 } from '../../../src/inference/activations.ts';
import { generateCached } from '../../../src/inference/generate.ts';
import { inferenceFromCheckpoint } from '../../../src/inference/load.ts';
import type { StageInference } from '../../../src/inference/stage-inference.ts';
import { gptConfig } from '../../../src/model/config.ts';
import { partCount, splitEvenly, type StageRange } from '../../../src/model/parts.ts';
import { Completions, type CompletionsOptions, type Failover, OpenAiError, parseCompletionRequest, type StageStep } from '../../../src/orchestrator/serving/completions.ts';
import type { Coordinator } from '../../../src/orchestrator/training/coordinator.ts';
import type { DeploymentRecord } from '../../../src/orchestrator/state/deployments.ts';
import type { Peer } from '../../../src/protocol/messages.ts';
import { domainOf } from '../../../src/protocol/network.ts';
import { SessionKey } from '../../../src/protocol/session-key.ts';
import { STALL_FLOOR_MS } from '../../../src/orchestrator/serving/stall-deadlines.ts';
import { startStageServer, type StageServer } from '../../helpers/stage-server.ts';
import { wholeModelBytes } from '../../helpers/whole-model.ts';

const config = gptConfig('gpt-micro');
const checkpoint = wholeModelBytes(41, 500);
const cuts = splitEvenly(config, 2);
const key = SessionKey.generate();
const domain = domainOf(key.publicKey);
let engine: Engine;
const stages: StageInference[] = [];
const servers: StageServer[] = [];
const fakes: Server[] = [];

before(async () => {
  engine = await Engine.create({ threads: 1 });
});
after(async () => {
  for (const s of servers) s.kill();
  for (const f of fakes) f.close();
  for (const s of stages) s.release();
  await engine.close();
});

const address = (n: number): string => `0x${n.toString(16).padStart(40, '0')}`;

/** A serving stage of parts `range` on a server of its own. */
async function serve(stage: number, range: StageRange, stageCount: number, n: number, delayMs = 0, hangAfter?: number): Promise<StageServer> {
  const inference = inferenceFromCheckpoint(engine, checkpoint, range, { maxSessions: 8 });
  stages.push(inference);
  const s = await startStageServer({ orchestratorKey: key.publicKey, domain, deploymentId: 'dep-1', stage, stageCount, inference, id: address(n), delayMs, hangAfter });
  servers.push(s);
  return s;
}

/** A coordinator whose deployment `dep-1` (gpt-micro, 8 sessions) is served by `replicas[stage]`. */
function coordinator(replicas: Peer[][], ranges: readonly StageRange[], logs: string[] = []): { c: Coordinator; d: DeploymentRecord } {
  const d = { id: 'dep-1', name: 'micro', sha256: 'a'.repeat(64), model: 'gpt-micro', status: 'serving', message: null, sessions: 8 } as unknown as DeploymentRecord;
  const c = {
    identity: { key, domain },
    state: { deployments: { stages: () => ranges.map((r, i) => ({ stage: i, fromPart: r.from, toPart: r.to })) } },
    deployments: { servingPeers: (_id: string, stage: number) => replicas[stage] ?? [], noteRequest: () => {} },
    log: (line: string) => logs.push(line),
  } as unknown as Coordinator;
  return { c, d };
}

interface Case { prompt: string; max_tokens: number; temperature: number; top_p?: number; seed: number; stop?: string[] }
const cases: Case[] = [
  { prompt: 'Call me Ishmael. ', max_tokens: 40, temperature: 0.9, top_p: 0.95, seed: 7 },
  { prompt: 'The whale', max_tokens: 30, temperature: 0, seed: 1 },
  { prompt: 'Ahab ', max_tokens: 60, temperature: 1, seed: 3, stop: ['e'] },
  { prompt: 'a prompt longer than the context', max_tokens: 35, temperature: 0.7, seed: 11 },
  { prompt: 'Queequeg', max_tokens: 45, temperature: 1.2, top_p: 0.8, seed: 5 },
  { prompt: '', max_tokens: 30, temperature: 0.5, seed: 9 },
];

/** What generateCached gives for `c`, the model cut as `ranges` with `activations` between the stages. */
function reference(c: Case, ranges: readonly StageRange[], activations: 'f16' | 'f32'): string {
  return generateCached(engine, checkpoint, c.prompt, { maxTokens: c.max_tokens, temperature: c.temperature, topP: c.top_p, seed: c.seed, stop: c.stop, stages: ranges, activations }).text;
}

const request = (c: Case) => parseCompletionRequest({ model: 'micro', ...c });

/** Generates `c` through `completions`, streaming: the text, and how many bytes had arrived. */
async function generate(completions: Completions, d: DeploymentRecord, c: Case, onBytes: (n: number) => void = () => {}): Promise<string> {
  let got = 0;
  const out = await completions.generate(d, request(c), (b) => onBytes((got += b.length)));
  return new TextDecoder().decode(out.bytes);
}

const perToken = { f16: [] as number[], f32: [] as number[] };

test('f16 frames by default: the text is generateCached cut the same way with f16 between the stages; f32 frames on request give the whole model\'s text', async () => {
  const a = await serve(0, cuts[0], 2, 1);
  const b = await serve(1, cuts[1], 2, 2);
  const { c, d } = coordinator([[a.peer], [b.peer]], cuts);
  for (const codec of ['f16', 'f32'] as const) {
    const completions = new Completions(c, codec === 'f32' ? { codec } : {});
    assert.equal(completions.activations, codec);
    const steps: StageStep[] = [];
    completions.observe({ stageStep: (s) => steps.push(s) });
    let tokens = 0;
    for (const k of cases) {
      const text = await generate(completions, d, k);
      assert.equal(text, reference(k, cuts, codec), `${codec}: ${JSON.stringify(k)}`);
      if (codec === 'f32') assert.equal(text, reference(k, [{ from: 0, to: partCount(config) }], 'f32'), 'f32 frames: the whole model\'s text');
      tokens += generateCached(engine, checkpoint, k.prompt, { maxTokens: k.max_tokens, temperature: k.temperature, topP: k.top_p, seed: k.seed, stop: k.stop }).completionTokens;
    }
    // what stage 0 answered is what the frame carried: every value a binary16 under f16, not so under f32
    const rows = steps.filter((s) => s.stage === 0).map((s) => s.output);
    const exact = rows.every((x) => roundToF16(x).every((v, i) => Object.is(v, x[i])));
    assert.equal(exact, codec === 'f16', `stage 0's rows ${codec === 'f16' ? 'are' : 'are not all'} binary16 values`);
    const bytes = steps.reduce((n, s) => n + s.bytesSent + s.bytesReceived, 0);
    (codec === 'f16' ? perToken.f16 : perToken.f32).push(bytes / tokens);
  }
  // an activation row is C × 2 bytes in f16 instead of C × 4, received from stage 0 and sent to stage 1 (headers and logits are the same)
  const saved = perToken.f32[0] - perToken.f16[0];
  assert.ok(saved >= 2 * config.channels * 2, `bytes per token: f16 ${perToken.f16[0]}, f32 ${perToken.f32[0]}`);
});

test('concurrent generations share each step\'s frames, and each text is what it is alone, in one lane or in a pipeline of lanes', async () => {
  const a = await serve(0, cuts[0], 2, 3);
  const b = await serve(1, cuts[1], 2, 4);
  const { c, d } = coordinator([[a.peer], [b.peer]], cuts);
  // by default a 2-stage route has 2 lanes (a pipeline): the texts are the same
  const pipeline = new Completions(c);
  const laneBatches: number[] = [];
  pipeline.observe({ stageStep: (s) => void (s.stage === 0 && laneBatches.push(s.batch ?? 1)) });
  const piped = await Promise.all(cases.map((k) => generate(pipeline, d, k)));
  piped.forEach((t, i) => assert.equal(t, reference(cases[i], cuts, 'f16'), `2 lanes: ${JSON.stringify(cases[i])}`));
  const most = Math.max(...laneBatches);
  assert.ok(most >= 2 && most <= cases.length / 2, `each of the 2 lanes carries up to half the ${cases.length} sessions: up to ${most}`);
  const completions = new Completions(c, { lanesPerRoute: 1 });
  const batches: number[] = [];
  completions.observe({ stageStep: (s) => void (s.stage === 0 && batches.push(s.batch ?? 1)) });
  const before = a.calls();
  const texts = await Promise.all(cases.map((k) => generate(completions, d, k)));
  texts.forEach((t, i) => assert.equal(t, reference(cases[i], cuts, 'f16'), JSON.stringify(cases[i])));
  assert.ok(Math.max(...batches) >= 4, `steps carried up to ${Math.max(...batches)} sessions`);
  // one frame per step, not one per session and step
  const frames = a.calls() - before;
  assert.ok(frames < batches.length * 0.6, `stage 0 got ${frames} frames for ${batches.length} session steps`);
});

test('a replica dropped mid-stream: its sessions are replayed on the other replica and every text is the one without the failure', async () => {
  const s0 = [await serve(0, cuts[0], 2, 5, 3), await serve(0, cuts[0], 2, 6, 3)];
  const s1 = [await serve(1, cuts[1], 2, 7, 3), await serve(1, cuts[1], 2, 8, 3)];
  const logs: string[] = [];
  const { c, d } = coordinator([s0.map((s) => s.peer), s1.map((s) => s.peer)], cuts, logs);
  const completions = new Completions(c);
  const failovers: Failover[] = [];
  completions.observe({ failover: (f) => failovers.push(f) });
  const got = cases.map(() => 0);
  let killed = false;
  const all = Promise.all(cases.map((k, i) => generate(completions, d, k, (n) => {
    got[i] = n;
    if (!killed && got.every((g) => g >= 3)) {
      killed = true;
      s1[0].kill();
    }
  })));
  const texts = await all;
  assert.ok(killed, 'the replica was dropped while every stream was under way');
  texts.forEach((t, i) => assert.equal(t, reference(cases[i], cuts, 'f16'), JSON.stringify(cases[i])));
  assert.ok(failovers.length >= 1, 'some sessions were on the dropped replica');
  for (const f of failovers) assert.deepEqual([f.stage, f.from, f.to], [1, s1[0].peer.id, s1[1].peer.id]);
  assert.ok(logs.some((l) => /replaying its \d+-token window/.test(l)), logs.join('\n'));
});

test('a replica that stops answering, its connection open, is failed over after STALL_FACTOR times its usual decode time, not the whole timeout; new generations avoid it while another serves', async () => {
  const s0 = await serve(0, cuts[0], 2, 11);
  const s1 = [await serve(1, cuts[1], 2, 12, 0, 30), await serve(1, cuts[1], 2, 13)];
  const { c, d } = coordinator([[s0.peer], s1.map((s) => s.peer)], cuts);
  // a timeout far longer than the test's own: only the stall deadline can fail the hung replica over in time
  const completions = new Completions(c, { timeoutMs: 600_000 });
  const failovers: Failover[] = [];
  completions.observe({ failover: (f) => failovers.push(f) });
  const texts = await Promise.all(cases.map((k) => generate(completions, d, k)));
  texts.forEach((t, i) => assert.equal(t, reference(cases[i], cuts, 'f16'), JSON.stringify(cases[i])));
  assert.ok(failovers.length >= 1, 'the sessions on the hung replica moved');
  for (const f of failovers) {
    assert.deepEqual([f.stage, f.from, f.to], [1, s1[0].peer.id, s1[1].peer.id]);
    const ms = Number(/no answer in (\d+) ms/.exec(f.reason)?.[1]);
    assert.ok(ms >= STALL_FLOOR_MS && ms < 600_000, f.reason);
  }
  // the hung replica is suspected: round-robin routes every new generation to the other
  const steps: StageStep[] = [];
  completions.observe({ stageStep: (s) => steps.push(s) });
  for (const k of cases.slice(0, 2)) assert.equal(await generate(completions, d, k), reference(k, cuts, 'f16'));
  assert.ok(steps.length > 0 && steps.filter((s) => s.stage === 1).every((s) => s.minerId === s1[1].peer.id));
  completions.close();
});

test('more generations than the replicas hold: the rest wait for room and every text is its own', async () => {
  const a = await serve(0, cuts[0], 2, 14);
  const b = await serve(1, cuts[1], 2, 15);
  const { c, d } = coordinator([[a.peer], [b.peer]], cuts);
  const completions = new Completions(c);
  // 8 sessions per replica (the stub deployment's and the servers' maxSessions): 14 requests at once
  const many = [...cases, ...cases.map((k) => ({ ...k, seed: k.seed + 100 })), cases[0], cases[1]];
  const texts = await Promise.all(many.map((k) => generate(completions, d, k)));
  texts.forEach((t, i) => assert.equal(t, reference(many[i], cuts, 'f16'), JSON.stringify(many[i])));
  completions.close();
});

/** A server answering every request with `status` (a serving channel's upgrade too: its calls then come over HTTP); counts its /infer calls. */
async function fakeMiner(status: number, code: string): Promise<{ peer: Peer; calls: () => number }> {
  let calls = 0;
  const id = address(1000 + fakes.length);
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      if (req.url === '/infer') calls++;
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: 'refused', code }));
    });
  });
  fakes.push(server);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { peer: { id, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, sessionKey: key.publicKey, weight: 1 }, calls: () => calls };
}

test('a miner refusing our request (4xx) is not replayed elsewhere; failovers are bounded; a failing replica before a good one is failed over', async () => {
  const whole = [{ from: 0, to: partCount(config) }];
  const good = await serve(0, whole[0], 1, 9);
  const k = cases[0];
  const generateOn = async (replicas: Peer[], options: CompletionsOptions = {}): Promise<string> => {
    const { c, d } = coordinator([replicas], whole);
    return generate(new Completions(c, options), d, k);
  };
  // 400: our request was bad; another replica would refuse it too
  const refusing = await fakeMiner(400, 'invalid');
  const calls = good.calls();
  await assert.rejects(generateOn([refusing.peer, good.peer]), (e: unknown) => e instanceof OpenAiError && e.status === 502 && /stage 0/.test(e.message));
  assert.equal(refusing.calls(), 1);
  assert.equal(good.calls(), calls, 'the good replica was never asked');
  // 500s everywhere: at most maxFailovers + 1 replicas tried
  const broken = await Promise.all([1, 2, 3, 4].map(() => fakeMiner(500, 'internal')));
  await assert.rejects(generateOn(broken.map((b) => b.peer), { maxFailovers: 2 }), (e: unknown) => e instanceof OpenAiError && e.status === 502 && /after 2 failovers/.test(e.message));
  assert.deepEqual(broken.map((b) => b.calls()), [1, 1, 1, 0]);
  // overloaded everywhere: a 503
  const full = await fakeMiner(503, 'overloaded');
  await assert.rejects(generateOn([full.peer]), (e: unknown) => e instanceof OpenAiError && e.status === 503);
  // a replica that fails, then a good one: the text is the reference
  const flaky = await fakeMiner(502, 'unreachable');
  assert.equal(await generateOn([flaky.peer, good.peer]), reference(k, whole, 'f32'));
});
