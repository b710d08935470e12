// Paying for inference without processes or a chain: API keys (bound to their
// wallet, hashed, revocable), the reservation before a generation and the
// charge after it (what was processed, never more than reserved, once, even
// aborted), the balance (402 when short, never negative, ending escrows
// first), the inference work log weighed by stage shares, and an epoch's draw
// from credit escrows: 80 % to the miners by weighted rows, the rest to the
// model's owner, across escrows, conserved to the wei.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { gptConfig } from '../../../src/model/config.ts';
import { partCount } from '../../../src/model/parts.ts';
import type { CompletionRequest } from '../../../src/orchestrator/serving/completion-request.ts';
import type { CompletionResult, StageStep } from '../../../src/orchestrator/serving/completions.ts';
import { CreditService, MINERS_SHARE_BPS } from '../../../src/orchestrator/serving/credits.ts';
import { costOf, hashApiKey, InferenceBilling, INFERENCE_TOKENS_PER_UNIT, PROGRESS_EVERY_MS } from '../../../src/orchestrator/serving/billing.ts';
import { JobPayments } from '../../../src/orchestrator/jobs/job-payments.ts';
import { scoreEpoch, stageSharesOf } from '../../../src/orchestrator/rewards/scoring.ts';
import type { DeploymentRecord } from '../../../src/orchestrator/state/deployments.ts';
import { OrchestratorState } from '../../../src/orchestrator/state/index.ts';

const ALICE = '0x00000000000000000000000000000000000a11ce';
const BOB = '0x0000000000000000000000000000000000000b0b';
const OWNER = '0x00000000000000000000000000000000000000ee';
const M1 = '0x0000000000000000000000000000000000000001';
const M2 = '0x0000000000000000000000000000000000000002';
const NIM = 10n ** 18n;
/** 2 NIM per 1,000 tokens */
const PRICE = 2n * NIM;
const DAY = 86_400_000;

interface World {
  state: OrchestratorState;
  credits: CreditService;
  billing: InferenceBilling;
  payments: JobPayments;
  d: DeploymentRecord;
  now: { t: number };
}

function world(price = PRICE): World {
  const state = OrchestratorState.open(':memory:');
  const now = { t: 1_000_000 };
  const clock = (): number => now.t;
  const payments = new JobPayments(state, { client: {} as never, signer: {} as never, log: () => {} }, clock);
  const credits = new CreditService(state, payments, { client: {} as never, signer: {} as never }, () => {}, clock);
  const billing = new InferenceBilling(state, credits, async () => ({ owner: OWNER, price }), () => {}, clock);
  const d = state.deployments.insert({ id: 'dep-000000000001', sha256: 'ab'.repeat(32), name: 'micro', owner: OWNER, model: 'gpt-micro', replicas: 1, requestedStages: 2, sessions: 4, registry: null, idleLimitMs: DAY }, now.t);
  const parts = partCount(gptConfig('gpt-micro'));
  state.deployments.insertStages(d.id, [{ from: 0, to: 1, memoryBytes: 1 }, { from: 1, to: parts, memoryBytes: 1 }]);
  return { state, credits, billing, payments, d, now };
}

function deposit(w: World, owner: string, amount: bigint, id: number): string {
  const escrowId = `0x${id.toString(16).padStart(64, '0')}`;
  w.state.credits.insert({ escrowId, owner, amount, refundAfter: w.now.t + 30 * DAY }, w.now.t);
  return escrowId;
}

const request = (prompt: string, maxTokens: number): CompletionRequest => ({
  model: 'micro', prompt: new TextEncoder().encode(prompt), maxTokens, temperature: 1, topP: 1, seed: 0, stop: [], stream: false,
});

function step(d: DeploymentRecord, session: string, stage: number, minerId: string, rows: number): StageStep {
  return { deployment: d, session, stage, minerId, reset: rows > 1, rows, input: new Float32Array(rows), output: new Float32Array(rows), bytesSent: 0, bytesReceived: 0 };
}

/** A generation of `generated` tokens through 2 stages (M1 stage 0, M2 stage 1) as the observer sees it. */
function run(w: World, session: string, promptTokens: number, generated: number): void {
  const observer = w.billing.observer();
  for (let i = 0; i < generated; i++) {
    const rows = i === 0 ? promptTokens : 1;
    observer.stageStep!(step(w.d, session, 0, M1, rows));
    observer.stageStep!(step(w.d, session, 1, M2, rows));
  }
}

async function rejectsWith(p: Promise<unknown> | (() => unknown), status: number, code: string, message?: RegExp): Promise<void> {
  await assert.rejects(async () => (typeof p === 'function' ? p() : p), (e: unknown) => {
    const err = e as { status: number; code: string; message: string };
    assert.equal(err.status, status, err.message);
    assert.equal(err.code, code);
    if (message) assert.match(err.message, message);
    return true;
  });
}

test('an API key is its wallet\'s, kept as a hash, shown once, and refused when missing, wrong or revoked', async () => {
  const w = world();
  const made = w.billing.createKey(ALICE, 'laptop');
  assert.match(made.key, /^nk-[0-9a-f]{48}$/);
  assert.equal(made.apiKey.owner, ALICE);
  assert.equal(w.state.apiKeys.byHash(hashApiKey(made.key))?.id, made.apiKey.id);
  assert.equal(JSON.stringify(w.state.apiKeys.list(ALICE)).includes(made.key), false, 'the key itself is not stored');
  assert.equal(w.billing.authorize(`Bearer ${made.key}`).owner, ALICE);
  await rejectsWith(() => w.billing.authorize(undefined), 401, 'invalid_api_key');
  // one hex digit changed (never the same digit again: a key ending in 0 once made this the key itself)
  const wrong = `${made.key.slice(0, -1)}${made.key.endsWith('0') ? '1' : '0'}`;
  await rejectsWith(() => w.billing.authorize(`Bearer ${wrong}`), 401, 'invalid_api_key');
  await rejectsWith(() => w.billing.authorize(made.key), 401, 'invalid_api_key');
  // another wallet cannot revoke it; its owner can, and then it is refused
  await rejectsWith(() => w.billing.revokeKey(made.apiKey.id, BOB), 404, 'not_found');
  assert.ok(w.billing.revokeKey(made.apiKey.id, ALICE).revokedAt !== null);
  await rejectsWith(() => w.billing.authorize(`Bearer ${made.key}`), 401, 'invalid_api_key', /revoked/);
  await rejectsWith(() => w.billing.revokeKey(made.apiKey.id, ALICE), 409, 'conflict');
});

test('a request reserves its most, is charged what it processed once, and a short balance is a 402 naming the balance and the cost', async () => {
  const w = world();
  const key = w.state.apiKeys.byHash(hashApiKey(w.billing.createKey(ALICE, undefined).key))!;
  // no credit: refused before anything runs
  await rejectsWith(w.billing.reserve(key, w.d, request('hello', 10)), 402, 'insufficient_quota', /balance is 0 NIM; this request may cost up to 0\.03 NIM/);
  deposit(w, ALICE, NIM / 10n, 1); // 0.1 NIM: 50 tokens
  const res = await w.billing.reserve(key, w.d, request('hello', 10));
  assert.equal(res.tokens, 15);
  assert.equal(w.credits.view(ALICE).reserved, costOf(PRICE, 15).toString());
  // a second request that does not fit what is left beside the reservation
  await rejectsWith(w.billing.reserve(key, w.d, request('x'.repeat(20), 20)), 402, 'insufficient_quota', /balance is 0\.07 NIM; this request may cost up to 0\.08 NIM/);
  w.billing.track(res, 'cmpl-1');
  run(w, 'cmpl-1', 5, 4);
  const result: CompletionResult = { id: 'cmpl-1', bytes: new Uint8Array(3), finishReason: 'stop', promptTokens: 5, completionTokens: 4 };
  assert.deepEqual(w.billing.settle(res, 'cmpl-1', result), { tokens: 9, charged: costOf(PRICE, 9) });
  assert.deepEqual(w.billing.settle(res, 'cmpl-1', result), { tokens: 0, charged: 0n }, 'a second settle charges nothing');
  const v = w.credits.view(ALICE);
  assert.equal(v.reserved, '0');
  assert.equal(v.spent, (18n * NIM / 1000n).toString());
  assert.equal(BigInt(v.balance), NIM / 10n - 18n * NIM / 1000n);
  // the work log: rows per miner and stage, in units
  const work = w.state.ledger.workBetween(0, w.state.ledger.lastWorkId());
  assert.deepEqual(work.map((r) => [r.minerId, r.kind, r.stage, r.deploymentId, r.units]), [
    [M1, 'inference', 0, w.d.id, 8 / INFERENCE_TOKENS_PER_UNIT],
    [M2, 'inference', 1, w.d.id, 8 / INFERENCE_TOKENS_PER_UNIT],
  ]);
});

test('an aborted generation is charged the prompt and the tokens sampled; one that ran nothing is released; a restart releases reservations', async () => {
  const w = world();
  deposit(w, ALICE, NIM, 1);
  const key = w.state.apiKeys.byHash(hashApiKey(w.billing.createKey(ALICE, undefined).key))!;
  const res = await w.billing.reserve(key, w.d, request('abcd', 100));
  w.billing.track(res, 'cmpl-a');
  run(w, 'cmpl-a', 4, 3); // the client left after 3 tokens
  assert.deepEqual(w.billing.settle(res, 'cmpl-a', null), { tokens: 7, charged: costOf(PRICE, 7) });
  const none = await w.billing.reserve(key, w.d, request('abcd', 100));
  w.billing.track(none, 'cmpl-b');
  assert.deepEqual(w.billing.settle(none, 'cmpl-b', null), { tokens: 0, charged: 0n });
  assert.equal(w.state.inferenceRequests.get(none.id)?.status, 'released');
  const left = await w.billing.reserve(key, w.d, request('abcd', 100));
  assert.notEqual(w.credits.view(ALICE).reserved, '0');
  new InferenceBilling(w.state, w.credits, null, () => {}, () => w.now.t); // the next run of the orchestrator
  assert.equal(w.state.inferenceRequests.get(left.id)?.status, 'released');
  assert.equal(w.credits.view(ALICE).reserved, '0');
  assert.deepEqual(w.billing.settle(left, null, null), { tokens: 0, charged: 0n });
});

test('a generation a crash cut short is charged at the next start for what it had processed, as last written, and its rows are its miners\' work', async () => {
  const w = world();
  deposit(w, ALICE, NIM, 1);
  const key = w.state.apiKeys.byHash(hashApiKey(w.billing.createKey(ALICE, undefined).key))!;
  const res = await w.billing.reserve(key, w.d, request('abcd', 100));
  w.billing.track(res, 'cmpl-c');
  run(w, 'cmpl-c', 4, 3); // the prompt and 3 tokens, nothing written yet (less than PROGRESS_EVERY_MS since the start)
  assert.deepEqual(w.state.inferenceRequests.work(res.id), []);
  w.now.t += PROGRESS_EVERY_MS;
  run(w, 'cmpl-c', 1, 2); // 2 more tokens: this step writes what was counted
  const written = w.state.inferenceRequests.get(res.id)!;
  assert.equal(written.status, 'reserved');
  assert.equal(written.sampled, 3, 'written at the next step (stage 0 of the 4th token): 3 sampled then');
  w.billing.writeProgress(); // the clock's tick writes the rest
  assert.equal(w.state.inferenceRequests.get(res.id)!.sampled, 5);
  assert.equal(w.state.ledger.lastWorkId(), 0, 'no work logged before it is charged');
  // the orchestrator dies here; the next run of it charges the prompt and the 5 tokens sampled, and logs the rows
  w.now.t += 1000;
  new InferenceBilling(w.state, w.credits, null, () => {}, () => w.now.t);
  const r = w.state.inferenceRequests.get(res.id)!;
  assert.equal(r.status, 'charged');
  assert.equal(r.tokens, 4 + 5);
  assert.equal(r.charged, costOf(PRICE, 9).toString());
  assert.equal(w.credits.view(ALICE).reserved, '0');
  assert.equal(w.credits.view(ALICE).owed, costOf(PRICE, 9).toString(), 'drawn at the next epoch');
  assert.deepEqual(w.state.inferenceRequests.work(res.id), [{ miner: M1, stage: 0, rows: 4 + 4 }, { miner: M2, stage: 1, rows: 4 + 4 }]);
  const work = w.state.ledger.workBetween(0, w.state.ledger.lastWorkId());
  assert.deepEqual(work.map((x) => [x.minerId, x.stage, x.kind, x.units * INFERENCE_TOKENS_PER_UNIT, x.deploymentId]), [[M1, 0, 'inference', 8, w.d.id], [M2, 1, 'inference', 8, w.d.id]]);
  // never more than reserved: a request of max_tokens 2 that sampled more before the crash is charged its reservation
  const small = await w.billing.reserve(key, w.d, request('ab', 2));
  w.billing.track(small, 'cmpl-d');
  w.now.t += PROGRESS_EVERY_MS;
  run(w, 'cmpl-d', 2, 6);
  w.billing.writeProgress();
  new InferenceBilling(w.state, w.credits, null, () => {}, () => w.now.t);
  assert.equal(w.state.inferenceRequests.get(small.id)!.tokens, 4);
  // the process that crashed cannot charge it again
  assert.deepEqual(w.billing.settle(res, 'cmpl-c', null), { tokens: 0, charged: 0n });
});

test('a free model needs a key but no credit; a revoked key cannot reserve', async () => {
  const w = world(0n);
  const made = w.billing.createKey(BOB, undefined);
  const key = w.billing.authorize(`Bearer ${made.key}`);
  const res = await w.billing.reserve(key, w.d, request('hi', 50));
  w.billing.track(res, 'cmpl-f');
  run(w, 'cmpl-f', 2, 2);
  assert.deepEqual(w.billing.settle(res, 'cmpl-f', null), { tokens: 4, charged: 0n });
  w.billing.revokeKey(made.apiKey.id, BOB);
  await rejectsWith(w.billing.reserve(key, w.d, request('hi', 5)), 401, 'invalid_api_key');
});

test('an epoch draws what was charged: 80 % to the miners by rows weighed by stage shares, the rest to the model owner, ending escrows first, to the wei', async () => {
  const w = world();
  const small = deposit(w, ALICE, NIM / 100n, 1); // 0.01 NIM
  const big = deposit(w, ALICE, NIM, 2);
  const key = w.state.apiKeys.byHash(hashApiKey(w.billing.createKey(ALICE, undefined).key))!;
  const res = await w.billing.reserve(key, w.d, request('x'.repeat(40), 60));
  w.billing.track(res, 'cmpl-e');
  run(w, 'cmpl-e', 40, 10);
  const { charged } = w.billing.settle(res, 'cmpl-e', null);
  assert.equal(charged, costOf(PRICE, 50)); // 0.1 NIM
  w.credits.withdraw(ALICE); // both end: they still pay what is owed
  assert.equal(w.credits.view(ALICE).balance, '0');
  const stages = w.state.deployments.stages(w.d.id);
  const shares = { [w.d.id]: stageSharesOf(w.d.model, stages.map((s) => ({ from: s.fromPart, to: s.toPart }))) };
  w.state.tx(() => w.credits.allocate(7, shares));
  const paid = w.state.credits.shares(7);
  const total = paid.reduce((a, s) => a + BigInt(s.amount), 0n);
  assert.equal(total, charged, 'everything charged is drawn, nothing more');
  assert.deepEqual(w.state.credits.payments().map((p) => [p.escrowId, p.total]), [[small, (NIM / 100n).toString()], [big, (charged - NIM / 100n).toString()]]);
  const byPayee = (payee: string, role: string): bigint => paid.filter((s) => s.payee === payee && s.role === role).reduce((a, s) => a + BigInt(s.amount), 0n);
  const miners = (charged * MINERS_SHARE_BPS) / 10_000n;
  const [s0, s1] = shares[w.d.id];
  // the split quantizes weighted rows to 1e-9 (scoring.ts splitEmission)
  const q1 = BigInt(Math.round(49 * s0 * 1e9));
  const q2 = BigInt(Math.round(49 * s1 * 1e9));
  assert.equal(byPayee(M1, 'miner'), (miners * q1) / (q1 + q2), "M1 gets its stage's share of the miners' 80 %");
  assert.equal(byPayee(M2, 'miner'), (miners * q2) / (q1 + q2));
  assert.ok(s0 < s1, 'the last stage holds more of gpt-micro (its head)');
  assert.equal(byPayee(OWNER, 'owner'), charged - byPayee(M1, 'miner') - byPayee(M2, 'miner'));
  assert.equal(w.state.inferenceRequests.get(res.id)?.epoch, 7);
  w.state.tx(() => w.credits.allocate(8, shares));
  assert.equal(w.state.credits.shares(8).length, 0, 'a request is drawn once');
  // the miners' scores weigh the units by the same shares
  const scores = scoreEpoch(w.state.ledger.workBetween(0, w.state.ledger.lastWorkId()), shares);
  assert.deepEqual(scores.map((s) => [s.miner, s.units.inference]), [[M1, 49 / INFERENCE_TOKENS_PER_UNIT], [M2, 49 / INFERENCE_TOKENS_PER_UNIT]]);
  assert.ok(Math.abs(scores[0].score - (49 / INFERENCE_TOKENS_PER_UNIT) * s0) < 1e-12);
});

test('a withdrawn credit stops counting at once while what is reserved is still covered; a credit near its refund time ends', async () => {
  const w = world();
  const key = w.state.apiKeys.byHash(hashApiKey(w.billing.createKey(ALICE, undefined).key))!;
  deposit(w, ALICE, NIM / 10n, 1);
  const res = await w.billing.reserve(key, w.d, request('abc', 7)); // 0.02 NIM held
  w.credits.withdraw(ALICE);
  assert.equal(w.credits.view(ALICE).balance, '0');
  await rejectsWith(w.billing.reserve(key, w.d, request('a', 1)), 402, 'insufficient_quota');
  deposit(w, ALICE, NIM / 10n, 2);
  assert.equal(w.credits.view(ALICE).balance, (NIM / 10n).toString(), 'the ending escrow covers what it reserved');
  w.billing.settle(res, null, null);
  w.now.t += 30 * DAY - DAY / 2;
  await w.credits.reconcile().catch(() => undefined); // the chain calls fail here; the state changes come first
  assert.deepEqual(w.state.credits.of(ALICE).map((c) => c.status).sort(), ['closing', 'closing']);
});

test('an escrow that is a credit can neither pay for a job nor be released, and a job\'s escrow cannot become credit', async () => {
  const w = world();
  const credit = deposit(w, ALICE, NIM, 1);
  await rejectsWith(w.payments.checkEscrow(credit, ALICE, NIM, 3_600_000), 409, 'conflict', /inference credit/);
  await rejectsWith(w.payments.release(credit, ALICE), 409, 'conflict', /inference credit/);
  await rejectsWith(w.credits.register(credit, ALICE), 409, 'conflict', /inference credit/);
  const jobEscrow = `0x${'7'.repeat(64)}`;
  w.state.escrows.insert({ jobId: 'job-0000000000000001', escrowId: jobEscrow, owner: ALICE, amount: NIM, price: 1 }, w.now.t);
  await rejectsWith(w.credits.register(jobEscrow, ALICE), 409, 'conflict', /pays for job/);
});


test('a synthetic generation is nobody\'s: nothing is reserved or charged, and its rows are logged as its miners\' inference work, even when it fails', async () => {
  const w = world();
  const result = (id: string): CompletionResult => ({ id, bytes: new Uint8Array(3), finishReason: 'length', promptTokens: 4, completionTokens: 3 });
  const out = await w.billing.unpaid(w.d, async (onId) => {
    onId('cmpl-s1');
    run(w, 'cmpl-s1', 4, 3);
    return result('cmpl-s1');
  });
  assert.equal(out.id, 'cmpl-s1');
  await assert.rejects(
    w.billing.unpaid(w.d, async (onId) => {
      onId('cmpl-s2');
      run(w, 'cmpl-s2', 4, 1);
      throw new Error('stage 1 is gone');
    }),
    /stage 1 is gone/,
  );
  const work = w.state.ledger.workBetween(0, w.state.ledger.lastWorkId());
  // 4 + 1 + 1 rows at each stage for the first, 4 for the second
  assert.deepEqual(
    work.map((r) => [r.minerId, r.stage, r.kind, r.units * INFERENCE_TOKENS_PER_UNIT, r.deploymentId]),
    [[M1, 0, 'inference', 6, w.d.id], [M2, 1, 'inference', 6, w.d.id], [M1, 0, 'inference', 4, w.d.id], [M2, 1, 'inference', 4, w.d.id]],
  );
  run(w, 'cmpl-s1', 4, 2); // steps after the end count for nothing
  assert.equal(w.state.ledger.workBetween(0, w.state.ledger.lastWorkId()).length, 4);
  assert.equal(w.state.inferenceRequests.price(w.d.sha256), undefined, 'nothing asked the registry for a price');
});
