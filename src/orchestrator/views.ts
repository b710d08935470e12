// The public API's views (src/api/schemas.ts) built from the orchestrator's
// state: what GET /miners, /runs, /work and /epochs answer.
import { formatEther } from 'viem';
import type { EpochView, MinerView, RunView, StageView, WorkTotal } from '../api/schemas.ts';
import type { MicrobatchFlow } from './training/microbatches.ts';
import type { OrchestratorState } from './state/index.ts';
import type { EpochRecord } from './state/ledger.ts';
import type { MinerRecord } from './state/miners.ts';
import type { RunRecord } from './state/runs.ts';

export function minerView(m: MinerRecord): MinerView {
  return {
    id: m.id,
    name: m.name,
    url: m.url,
    gflops: m.gflops,
    threads: m.threads,
    memoryBytes: m.memoryBytes,
    bandwidthMbps: m.bandwidthMbps,
    joinedAt: m.joinedAt,
    lastSeen: m.lastSeen,
    alive: m.alive,
    serve: m.serve,
    backend: m.backend,
    adapter: m.adapter,
    softwareAdapter: m.softwareAdapter,
  };
}

export function runView(state: OrchestratorState, flow: MicrobatchFlow, run: RunRecord): RunView {
  const assignments = state.runs.assignments(run.id);
  const stages: StageView[] = state.runs.stages(run.id).map((s) => {
    const round = state.mergeRounds.get({ runId: run.id, stage: s.stage, round: s.round + 1 });
    return {
      stage: s.stage,
      parts: [s.fromPart, s.toPart],
      mode: s.mode,
      mergePhase: round && round.status !== 'done' ? round.status : null,
      replicas: assignments
        .filter((a) => a.stage === s.stage)
        .map((a) => {
          const m = state.miners.get(a.minerId);
          return { id: a.minerId, name: m?.name ?? '?', alive: m?.alive ?? false, gflops: m?.gflops ?? 0 };
        }),
      round: s.round,
      innerSteps: s.innerSteps,
      loss: s.lastLoss,
    };
  });
  return {
    id: run.id,
    owner: run.owner,
    model: run.model,
    data: run.data,
    status: run.status,
    steps: run.steps,
    microbatchesDone: run.microbatchesDone,
    tokensDone: run.tokensDone,
    tokensPerSecond: flow.tokensPerSecond(run.id),
    mergesDone: run.mergesDone,
    bytesSent: run.bytesSent,
    loss: run.lastLoss,
    batchSize: run.batchSize,
    mergeEvery: run.mergeEvery,
    stages,
    checks: checksView(state, run.id),
    bottleneckTokensPerS: run.plan?.bottleneckTokensPerS ?? null,
    message: run.message,
    createdAt: run.createdAt,
    startedAt: run.startedAt,
    finishedAt: run.finishedAt,
  };
}

function checksView(state: OrchestratorState, runId: string): RunView['checks'] {
  const byMiner = new Map<string, RunView['checks'][number]>();
  for (const t of state.spotChecks.totals(runId)) {
    let v = byMiner.get(t.minerId);
    if (!v) byMiner.set(t.minerId, (v = { miner: t.minerId, name: state.miners.get(t.minerId)?.name ?? null, passed: 0, failed: 0, open: 0 }));
    if (t.status === 'passed') v.passed += t.n;
    else if (t.status === 'failed') v.failed += t.n;
    else if (t.status === 'asked') v.open += t.n;
  }
  return [...byMiner.values()];
}

/** The work log summed per miner and kind: of one run, or of all. */
export function workView(state: OrchestratorState, runId?: string): WorkTotal[] {
  return state.ledger.workTotals(runId).map((t) => ({ miner: t.minerId, kind: t.kind, units: t.units }));
}

export function epochView(state: OrchestratorState, e: EpochRecord): EpochView {
  const nim = (wei: string | null): string | null => (wei === null ? null : formatEther(BigInt(wei)));
  return {
    id: e.id,
    status: e.status,
    runId: e.runId,
    workLog: [e.fromLog, e.toLog],
    openedAt: e.openedAt,
    closedAt: e.closedAt,
    emission: nim(e.emission),
    remainder: nim(e.remainder),
    chainId: e.chainId,
    chainEpoch: e.chainEpoch,
    txHash: e.txHash,
    settledAt: e.settledAt,
    error: e.error,
    attempts: e.attempts,
    retryAt: e.retryAt,
    rewards: state.ledger.rewards(e.id).map((r) => ({
      miner: r.miner,
      name: state.miners.get(r.miner)?.name ?? null,
      score: r.score,
      amount: formatEther(BigInt(r.amount)),
      amountWei: r.amount,
      units: r.units,
    })),
    inferencePayments: inferencePaymentsOf(state, e.id),
    slashes: state.ledger.slashes({ epoch: e.id }).map((x) => ({
      miner: x.miner,
      check: x.checkId,
      failed: x.failed,
      amount: nim(x.amount),
      amountWei: x.amount,
      status: x.status,
      txHash: x.txHash,
      reason: x.reason,
      error: x.error,
      attempts: x.attempts,
      retryAt: x.retryAt,
    })),
  };
}

/** What credit escrows paid for an epoch's inference, per payee and role (the escrows summed). */
function inferencePaymentsOf(state: OrchestratorState, epoch: number): EpochView['inferencePayments'] {
  const byKey = new Map<string, { payee: string; role: 'miner' | 'owner'; wei: bigint; pending: boolean }>();
  for (const s of state.credits.shares(epoch)) {
    if (s.status === 'unpaid') continue; // its escrow was closed on chain first: never paid (its credit escrow says so)
    const key = `${s.payee}/${s.role}`;
    const hit = byKey.get(key) ?? { payee: s.payee, role: s.role, wei: 0n, pending: false };
    hit.wei += BigInt(s.amount);
    hit.pending ||= s.status === 'pending';
    byKey.set(key, hit);
  }
  return [...byKey.values()].map((p) => ({
    payee: p.payee,
    name: state.miners.get(p.payee)?.name ?? null,
    role: p.role,
    amount: formatEther(p.wei),
    amountWei: p.wei.toString(),
    status: p.pending ? 'pending' : 'paid',
  }));
}
