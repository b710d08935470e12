// Synthetic traffic with an injected clock and timer, and a fake serving path:
// RATE requests a second, spread over the serving deployments in turn, each
// request's prompt (cut from the text at a word) and sampling fixed by (seed,
// k), at most maxInFlight at once (the rest counted, not queued), nothing
// sent while no byte-level model serves, the counts logged, and close()
// aborting what runs and sending nothing more.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { mobyDickBytes } from '../../../src/data/corpus.ts';
import type { CompletionRequest, CompletionResult } from '../../../src/orchestrator/serving/completions.ts';
import type { DeploymentRecord } from '../../../src/orchestrator/state/deployments.ts';
import { SyntheticPrompts, syntheticOptions, syntheticRequest } from '../../../src/orchestrator/serving/synthetic-prompts.ts';

const TEXT = mobyDickBytes();

function dep(id: string, model = 'gpt-micro', status = 'serving'): DeploymentRecord {
  return { id, sha256: id.padEnd(64, '0'), name: id, model, status } as unknown as DeploymentRecord;
}

/** A clock and a one-timer scheduler the test moves by hand. */
function fakeTime(): { now: () => number; schedule: (fn: () => void, ms: number) => () => void; advance: (ms: number) => Promise<void>; pending: () => number } {
  let t = 1_000_000;
  let timer: { at: number; fn: () => void } | null = null;
  return {
    now: () => t,
    schedule: (fn, ms) => {
      assert.equal(timer, null, 'one timer at a time');
      const mine = { at: t + ms, fn };
      timer = mine;
      return () => {
        if (timer === mine) timer = null;
      };
    },
    async advance(ms) {
      const end = t + ms;
      while (timer && timer.at <= end) {
        t = timer.at;
        const { fn } = timer;
        timer = null;
        fn();
        await new Promise((r) => setImmediate(r));
      }
      t = end;
    },
    pending: () => (timer ? 1 : 0),
  };
}

test('syntheticRequest is a deterministic prompt cut at a word, with its sampling', () => {
  const o = { seed: 5, maxTokens: 20, promptBytes: [16, 48] as const };
  const a = syntheticRequest(TEXT, o, 3);
  assert.deepEqual(a, syntheticRequest(TEXT, o, 3));
  assert.notDeepEqual(a.prompt, syntheticRequest(TEXT, o, 4).prompt);
  assert.notDeepEqual(a.prompt, syntheticRequest(TEXT, { ...o, seed: 6 }, 3).prompt);
  for (let k = 0; k < 50; k++) {
    const r = syntheticRequest(TEXT, o, k);
    assert.ok(r.prompt.length >= 16 && r.prompt.length <= 48, `${r.prompt.length}`);
    const at = Buffer.from(TEXT).indexOf(Buffer.from(r.prompt));
    assert.ok(at > 0 && (TEXT[at - 1] === 0x20 || TEXT[at - 1] === 0x0a), 'starts after a space or a newline');
    assert.equal(r.seed, k);
    assert.equal(r.maxTokens, 20);
    assert.ok(r.temperature >= 0.7 && r.temperature <= 1);
  }
  assert.throws(() => syntheticOptions({ rate: 0 }), /rate must be in \(0, 100\]/);
  assert.throws(() => syntheticOptions({ rate: 101 }), RangeError);
  assert.throws(() => syntheticOptions({ rate: 1, maxInFlight: 0 }), /maxInFlight/);
  assert.throws(() => syntheticOptions({ rate: 1, promptBytes: [10, 5] }), /promptBytes/);
});

test('RATE requests a second over the serving deployments, at most maxInFlight at once, logged, stopped cleanly', async () => {
  const time = fakeTime();
  let serving = [dep('dep-b'), dep('dep-a'), dep('dep-c', 'gpt-micro', 'deploying')];
  const calls: { d: string; r: CompletionRequest; aborted: () => boolean; finish: (ok: boolean) => void }[] = [];
  const logs: string[] = [];
  const s = new SyntheticPrompts(
    {
      serving: () => serving,
      generate: (d, r, aborted) =>
        new Promise<CompletionResult>((resolve, reject) => {
          calls.push({ d: d.id, r, aborted, finish: (ok) => (ok ? resolve({ id: 'cmpl-x', bytes: new Uint8Array(3), finishReason: 'length', promptTokens: r.prompt.length, completionTokens: r.maxTokens }) : reject(new Error('stage 1 failed'))) });
        }),
      text: () => TEXT,
      now: time.now,
      schedule: time.schedule,
      log: (l) => logs.push(l),
    },
    { rate: 4, maxInFlight: 3, maxTokens: 8, seed: 1, summaryMs: 10_000 },
  );
  s.start();
  await time.advance(249);
  assert.equal(calls.length, 0);
  await time.advance(1);
  assert.equal(calls.length, 1, 'the first request is due one interval (250 ms) in');
  await time.advance(500);
  assert.equal(calls.length, 3);
  // spread in turn over the serving deployments (by id), not the one still deploying
  assert.deepEqual(calls.map((c) => c.d), ['dep-a', 'dep-b', 'dep-a']);
  assert.equal(calls[0].r.model, dep('dep-a').sha256);
  assert.deepEqual(calls[1].r.prompt, syntheticRequest(TEXT, s.options, 1).prompt);
  // 3 running: the next ones due are skipped, not queued
  await time.advance(500);
  assert.equal(calls.length, 3);
  assert.equal(s.stats().busy, 2);
  calls[0].finish(true);
  calls[1].finish(false);
  await new Promise((r) => setImmediate(r));
  await time.advance(250);
  assert.equal(calls.length, 4);
  assert.deepEqual(calls[3].r.seed, 5);
  const st = s.stats();
  assert.deepEqual([st.sent, st.completed, st.failed, st.busy, st.tokens, st.inFlight], [4, 1, 1, 2, 8, 2]);
  // no serving deployment: counted, nothing sent
  serving = [dep('dep-d', 'gpt-micro', 'deploying')];
  await time.advance(1000);
  assert.equal(calls.length, 4);
  assert.equal(s.stats().idle, 4);
  // a summary every summaryMs
  await time.advance(8000);
  assert.match(logs.join('\n'), /synthetic prompts: 4 sent, 1 completed \(8 tokens\), 1 failed, 2 skipped \(3 running\), \d+ with no model serving; last error: dep-b: stage 1 failed/);
  // close: the clock stops, the running requests are aborted, close waits for them
  serving = [dep('dep-a')];
  assert.equal(calls[2].aborted(), false);
  const closing = s.close();
  assert.equal(calls[2].aborted(), true);
  assert.equal(time.pending(), 0, 'no timer left');
  calls[2].finish(false);
  calls[3].finish(true);
  await closing;
  assert.equal(s.stats().failed, 1, 'a request ended by close is not a failure');
  assert.match(logs.at(-1)!, /^synthetic prompts, stopped: 4 sent, 2 completed/);
  await time.advance(5000);
  assert.equal(calls.length, 4, 'nothing sent after close');
});
