// Spot checks of inference without child processes: the recorder's sampling
// and windows (reset to reset, a session's end, idleness, the memory budget,
// a miner changing mid-window) with an injected draw and clock; the replay's
// comparison on a real engine (honest answers in f32 and f16 bitwise equal to
// the recomputation, a noisy step or a single changed row of a prefill
// caught, rounding within the thresholds passed); and the service on a real
// OrchestratorState and blob store: honest windows pass, a cheat's window is
// charged once as 'failed_check' work with a pending slash and an eviction,
// a window whose model file is gone charges nobody.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { Engine } from '../../../src/engine/engine.ts';
import { inferenceFromCheckpoint } from '../../../src/inference/load.ts';
import type { StageInference } from '../../../src/inference/stage-inference.ts';
import { gptConfig } from '../../../src/model/config.ts';
import { partCount } from '../../../src/model/parts.ts';
import { mulberry32 } from '../../../src/model/init.ts';
import { FsBlobStore } from '../../../src/orchestrator/blobs/blobs.ts';
import type { StageStep } from '../../../src/orchestrator/serving/completions.ts';
import { InferenceChecks } from '../../../src/orchestrator/serving/checks.ts';
import { ByteBudget, InferenceRecorder, type RecordedWindow } from '../../../src/orchestrator/serving/check-recorder.ts';
import { compareStep, roundedToF16, UncheckableError, verifyWindow } from '../../../src/orchestrator/serving/check-verify.ts';
import { Offences } from '../../../src/orchestrator/rewards/offences.ts';
import type { DeploymentRecord } from '../../../src/orchestrator/state/deployments.ts';
import { OrchestratorState } from '../../../src/orchestrator/state/index.ts';
import { wholeModelBytes } from '../../helpers/whole-model.ts';

const CONFIG = gptConfig('gpt-micro');
const PARTS = partCount(CONFIG);
const CUT = [{ from: 0, to: 2 }, { from: 2, to: PARTS }];
const BYTES = wholeModelBytes(41, 500);
let engine: Engine;

before(async () => {
  engine = await Engine.create({ threads: 1 });
});
after(async () => {
  await engine.close();
});

function deployment(sha256 = 'a'.repeat(64)): DeploymentRecord {
  return { id: 'dep-1', sha256, name: 'micro', model: 'gpt-micro', status: 'serving' } as unknown as DeploymentRecord;
}

/** What the relay hands its observers for one generation through the 2-stage cut, run by honest stages; `alter(stage, step, out)` lets a stage cheat. */
function generation(
  stages: StageInference[], session: string, prompt: number[], decodes: number, opts: { f16?: boolean; alter?: (stage: number, step: number, out: Float32Array) => void; miners?: string[] } = {},
): StageStep[] {
  const d = deployment();
  const steps: StageStep[] = [];
  const rng = mulberry32(7);
  let tokens = prompt;
  for (let i = 0; i <= decodes; i++) {
    let data: Float32Array = Float32Array.from(tokens);
    for (let s = 0; s < stages.length; s++) {
      const inf = stages[s];
      if (i === 0) inf.join(session);
      const input = data;
      let out: Float32Array = inf.run([{ session, input: s === 0 ? Int32Array.from(input) : input }]);
      opts.alter?.(s, i, out);
      if (opts.f16) out = roundedToF16(out);
      steps.push({ deployment: d, session, stage: s, minerId: opts.miners?.[s] ?? `0xminer${s}`, reset: i === 0, rows: tokens.length, input, output: out, bytesSent: 0, bytesReceived: 0 });
      data = out;
    }
    tokens = [Math.floor(rng() * 256)];
  }
  for (const inf of stages) inf.leave(session);
  return steps;
}

const honestStages = (): StageInference[] => CUT.map((r) => inferenceFromCheckpoint(engine, BYTES, r, { maxSessions: 2 }));

/** Records every step given (rate 1) and returns the windows handed on. */
function recordAll(steps: StageStep[], options: { maxBytes?: number } = {}): { windows: RecordedWindow[]; recorder: InferenceRecorder; budget: ByteBudget } {
  const windows: RecordedWindow[] = [];
  const budget = new ByteBudget(options.maxBytes ?? 1 << 30);
  const recorder = new InferenceRecorder({ rate: 1, idleMs: 1000 }, budget, (w) => windows.push(w), () => 0);
  for (const s of steps) recorder.stageStep(s);
  recorder.endSession(steps[0].session);
  return { windows, recorder, budget };
}

test('the recorder samples windows at resets, ends them at the next reset, the session end or idleness, and keeps within its budget', () => {
  let now = 0;
  const draws = [true, false, true, true, true];
  const windows: RecordedWindow[] = [];
  const budget = new ByteBudget(10_000);
  const logs: string[] = [];
  const r = new InferenceRecorder({ rate: 0.5, idleMs: 1000 }, budget, (w) => windows.push(w), () => now, () => draws.shift() ?? false, (l) => logs.push(l));
  const d = deployment();
  const step = (session: string, stage: number, reset: boolean, values: number[], minerId = '0xa'): StageStep => ({
    deployment: d, session, stage, minerId, reset, rows: values.length, input: Float32Array.from(values), output: Float32Array.from(values.map((v) => v * 2)), bytesSent: 0, bytesReceived: 0,
  });
  r.stageStep(step('s1', 0, true, [1, 2])); // sampled
  r.stageStep(step('s1', 1, true, [3])); // not sampled
  r.stageStep(step('s1', 1, false, [4])); // ignored: its window was not sampled
  const first = step('s1', 0, false, [5]);
  r.stageStep(first);
  first.input[0] = 99; // the record is a copy
  assert.equal(windows.length, 0);
  r.stageStep(step('s1', 0, true, [6, 7, 8])); // a restart of the context: the first window ends, the next is sampled
  assert.equal(windows.length, 1);
  assert.deepEqual(windows[0].steps.map((s) => [...s.input]), [[1, 2], [5]]);
  assert.deepEqual([...windows[0].steps[1].output], [10]);
  assert.equal(windows[0].bytes, (2 + 2 + 1 + 1) * 4);
  r.completed(d, {} as never, { id: 's1', bytes: new Uint8Array(), finishReason: 'length', promptTokens: 2, completionTokens: 1 });
  assert.equal(windows.length, 2);
  assert.deepEqual(windows.map((w) => w.seq), [0, 1]);
  // a generation that failed is not named: its window ends once idle
  r.stageStep(step('s2', 0, true, [1]));
  now = 999;
  r.sweep();
  assert.equal(windows.length, 2);
  now = 1000;
  r.completed(d, {} as never, null);
  assert.equal(windows.length, 3);
  assert.equal(r.openWindows, 0);
  // a step past the budget drops its window and gives its bytes back
  const held = budget.used;
  r.stageStep(step('s3', 0, true, new Array(2000).fill(1)));
  assert.equal(budget.used, held);
  assert.equal(r.counts.dropped, 1);
  assert.match(logs.join('\n'), /memory budget of 10000 bytes/);
  assert.deepEqual(r.counts, { sampled: 4, handedOn: 3, dropped: 1 });
  assert.throws(() => new InferenceRecorder({ rate: 1.5, idleMs: 1 }, budget, () => {}), /rate must be in \[0, 1\]/);
});

test('a window whose steps change miner is dropped, not checked', () => {
  const windows: RecordedWindow[] = [];
  const r = new InferenceRecorder({ rate: 1, idleMs: 1000 }, new ByteBudget(1 << 20), (w) => windows.push(w), () => 0);
  const d = deployment();
  const s = (minerId: string, reset: boolean): StageStep => ({ deployment: d, session: 'x', stage: 0, minerId, reset, rows: 1, input: new Float32Array(1), output: new Float32Array(1), bytesSent: 0, bytesReceived: 0 });
  r.stageStep(s('0xa', true));
  r.stageStep(s('0xb', false));
  r.endSession('x');
  assert.equal(windows.length, 0);
  assert.equal(r.counts.dropped, 1);
  // a reset on another miner begins a window of its own
  r.stageStep(s('0xb', true));
  r.endSession('x');
  assert.deepEqual(windows.map((w) => w.minerId), ['0xb']);
});

test('compareStep: bitwise equal in f32 or once rounded to f16, else row by row against the thresholds', () => {
  const x = Float32Array.from({ length: 64 }, (_, i) => Math.sin(i) * 3);
  assert.equal(compareStep(x, x.slice(), 32).exact, 'f32');
  assert.equal(compareStep(x, roundedToF16(x), 32).exact, 'f16');
  const ulp = x.slice();
  ulp[5] = Math.fround(ulp[5] * (1 + 2 ** -22));
  const near = compareStep(x, ulp, 32);
  assert.equal(near.exact, null);
  assert.equal(near.badRow, -1);
  const oneRow = x.slice();
  for (let i = 32; i < 64; i++) oneRow[i] += 0.05 * Math.cos(i * 7);
  assert.equal(compareStep(x, oneRow, 32).badRow, 1);
  assert.throws(() => compareStep(x, x.subarray(1), 32), RangeError);
});

test('an honest window replays bit for bit (f32 and f16 frames); noise on any step, or one changed row of a prefill, fails', async () => {
  const replay = CUT.map((r) => inferenceFromCheckpoint(engine, BYTES, r, { maxSessions: 1 }));
  const miners = honestStages();
  try {
    const prompt = Array.from(new TextEncoder().encode('Call me ')); // 8 tokens, + 7 decoded: the context of 16
    for (const f16 of [false, true]) {
      const { windows } = recordAll(generation(miners, `honest-${f16}`, prompt, 7, { f16 }));
      assert.equal(windows.length, 2);
      for (const w of windows) {
        const o = await verifyWindow(replay[w.stage], w);
        assert.ok(o.passed, o.detail);
        assert.equal(o.exact, 8, o.detail);
        assert.equal(o.steps, 8);
        assert.match(o.detail, /each bitwise equal/);
      }
    }
    // 1% noise on the 5th step's activations of stage 0: stage 0 fails; stage 1, fed the noisy rows, answered them honestly and passes
    const noise = mulberry32(3);
    const noisy = generation(miners, 'noisy', prompt, 6, { alter: (s, i, out) => s === 0 && i === 4 && out.forEach((v, j) => (out[j] = v * (1 + 0.02 * (noise() - 0.5)) + 0.01 * (noise() - 0.5))) });
    const [w0, w1] = recordAll(noisy).windows;
    const bad = await verifyWindow(replay[0], w0);
    assert.equal(bad.passed, false);
    assert.match(bad.detail, /^step 4 of 7/);
    assert.equal(bad.exact, 4);
    assert.ok((await verifyWindow(replay[1], w1)).passed);
    // logits changed on the last stage
    const logits = recordAll(generation(miners, 'logits', prompt, 3, { alter: (s, i, out) => s === 1 && i === 2 && (out[17] += 1) })).windows;
    assert.match((await verifyWindow(replay[1], logits[1])).detail, /^step 2 of 4/);
    // one row of the prefill's 8 rows changed
    const row = recordAll(generation(miners, 'row', prompt, 1, { alter: (s, i, out) => s === 0 && i === 0 && out.fill(0.5, 5 * CONFIG.channels, 6 * CONFIG.channels) })).windows;
    assert.match((await verifyWindow(replay[0], row[0])).detail, /row 5 is off/);
    // the replay session is gone after each window, passed or not
    assert.equal(replay[0].sessionIds().length, 0);
    // a window that cannot be replayed charges nobody: it throws UncheckableError
    const broken = { ...w0, steps: [{ input: Float32Array.from([300]), output: w0.steps[0].output }] };
    await assert.rejects(verifyWindow(replay[0], broken), UncheckableError);
  } finally {
    for (const s of [...replay, ...miners]) s.release();
  }
});

test('the service recomputes queued windows off the request path: honest ones pass, a cheat is charged once (work, slash, eviction), a missing model file charges nobody', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'nimble-inference-checks-'));
  const state = OrchestratorState.open(join(dir, 'o.sqlite'));
  const blobs = await FsBlobStore.open(join(dir, 'blobs'));
  const miners = honestStages();
  try {
    const sha256 = await blobs.put(BYTES);
    const now = 1_700_000_000_000;
    const live = state.deployments.insert({ id: 'dep-1', sha256, name: 'micro', owner: '0x' + '1'.repeat(40), model: 'gpt-micro', replicas: 1, requestedStages: 2, sessions: 4, registry: null, idleLimitMs: 3_600_000 }, now);
    state.deployments.insertStages(live.id, CUT.map((r) => ({ ...r, memoryBytes: 1 })));
    const evicted: string[] = [];
    const offences = new Offences(state, { enabled: true, fraction: 0.5 }, (id) => evicted.push(id));
    const logs: string[] = [];
    const checks = new InferenceChecks({ state, blobs, engine: async () => engine, offences, now: () => now, log: (l) => logs.push(l) }, { rate: 1 });
    const r = checks.recorder;
    const prompt = Array.from(new TextEncoder().encode('The whale'));
    const feed = (steps: StageStep[]): void => {
      for (const s of steps) r.stageStep({ ...s, deployment: live });
      r.completed(live, {} as never, { id: steps[0].session, bytes: new Uint8Array(), finishReason: 'length', promptTokens: 1, completionTokens: 1 });
    };
    feed(generation(miners, 'cmpl-honest', prompt, 6, { miners: ['0xhonest0', '0xhonest1'] }));
    feed(generation(miners, 'cmpl-cheat', prompt, 6, { miners: ['0xhonest0', '0xcheat'], alter: (s, _i, out) => s === 1 && out.forEach((v, j) => (out[j] = v + 0.3 * Math.sin(j))) }));
    assert.ok(checks.bytesHeld > 0);
    await checks.settled();
    assert.equal(checks.bytesHeld, 0, 'every byte recorded is given back once checked');
    const c = checks.counts();
    assert.deepEqual([c.sampled, c.handedOn, c.passed, c.failed, c.uncheckable, c.queued], [4, 4, 3, 1, 0, 0], logs.join('\n'));
    assert.deepEqual(evicted, ['0xcheat']);
    const work = state.ledger.workTotals();
    assert.deepEqual(work.map((w) => [w.minerId, w.kind, w.units]), [['0xcheat', 'failed_check', 1]]);
    const slashes = state.ledger.slashes();
    assert.equal(slashes.length, 1);
    assert.equal(slashes[0].miner, '0xcheat');
    assert.match(slashes[0].reason, /^nimble inference check dep-1\/cmpl-cheat\/1\/\d+$/);
    // the same offence charged again (a resend) slashes nothing more
    state.tx(() => offences.charge({ minerId: '0xcheat', runId: null, stage: 1, kind: 'failed_check', detail: 'again', key: slashes[0].reason.slice('nimble '.length) }, now));
    assert.equal(state.ledger.slashes().length, 1);
    assert.match(logs.join('\n'), /inference check of miner 0xhonest1 .*: passed, 7 steps, each bitwise equal/);
    assert.match(logs.join('\n'), /inference check of miner 0xcheat .*: FAILED, step 0 of 7/);

    // the model file gone: nothing can be recomputed, nobody is charged
    await checks.close();
    const gone = new InferenceChecks({ state, blobs, engine: async () => engine, offences, now: () => now, log: (l) => logs.push(l) }, { rate: 1 });
    await blobs.delete(sha256);
    for (const s of generation(miners, 'cmpl-later', prompt, 2, { miners: ['0xcheat', '0xcheat'], alter: (_s, _i, out) => out.fill(1) })) gone.recorder.stageStep({ ...s, deployment: live });
    gone.recorder.endSession('cmpl-later');
    await gone.settled();
    assert.deepEqual([gone.counts().uncheckable, gone.counts().failed], [2, 0]);
    assert.equal(state.ledger.slashes().length, 1);
    await gone.close();
  } finally {
    for (const s of miners) s.release();
    state.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
