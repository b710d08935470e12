// What GET /runs/:id shows, and the whole-model checkpoint assembled from the
// stages' latest merged states (bytes rearranged, no kernels run).
import { CHECKPOINT_FORMAT, checkpointInfo } from '../model/checkpoint.ts';
import { gptConfig } from '../model/config.ts';
import { partCount } from '../model/gpt.ts';
import { decodeSafetensors, encodeSafetensors, type NamedTensor } from '../model/safetensors.ts';
import type { Plan } from '../planner/placement.ts';
import type { Coordinator } from './coordinator.ts';
import { formatEther } from 'viem';
import type { EpochRow, OrchestratorDb, RunRow } from './db.ts';
import { CoordinatorError } from './errors.ts';

export interface StageView {
  stage: number;
  parts: [number, number];
  mode: 'training' | 'merging';
  mergePhase: string | null;
  replicas: { id: string; name: string; alive: boolean; gflops: number }[];
  round: number;
  innerSteps: number;
  loss: number | null;
}

export interface RunView {
  id: string;
  model: string;
  data: string;
  status: string;
  steps: number;
  microbatchesDone: number;
  tokensDone: number;
  tokensPerSecond: number;
  mergesDone: number;
  bytesSent: number;
  loss: number | null;
  batchSize: number;
  mergeEvery: number;
  stages: StageView[];
  /** spot checks of this run's forwards, per miner */
  checks: { miner: string; name: string | null; passed: number; failed: number; open: number }[];
  bottleneckTokensPerS: number | null;
  message: string | null;
  createdAt: number;
  startedAt: number | null;
  finishedAt: number | null;
}

export function runView(c: Coordinator, run: RunRow): RunView {
  const plan = JSON.parse(run.plan) as Plan | null;
  const assignments = c.db.assignments(run.id);
  const stages: StageView[] = c.db.stages(run.id).map((s) => {
    const round = c.db.mergeRound(run.id, s.stage, s.round + 1);
    return {
      stage: s.stage,
      parts: [s.from_part, s.to_part],
      mode: s.mode,
      mergePhase: round && round.status !== 'done' ? round.status : null,
      replicas: assignments
        .filter((a) => a.stage === s.stage)
        .map((a) => {
          const m = c.db.miner(a.miner_id);
          return { id: a.miner_id, name: m?.name ?? '?', alive: Boolean(m?.alive), gflops: m?.gflops ?? 0 };
        }),
      round: s.round,
      innerSteps: s.inner_steps,
      loss: s.last_loss,
    };
  });
  return {
    id: run.id,
    model: run.model,
    data: run.data,
    status: run.status,
    steps: run.steps,
    microbatchesDone: run.microbatches_done,
    tokensDone: run.tokens_done,
    tokensPerSecond: c.tokensPerSecond(run.id),
    mergesDone: run.merges_done,
    bytesSent: run.bytes_sent,
    loss: run.last_loss,
    batchSize: run.batch_size,
    mergeEvery: run.merge_every,
    stages,
    checks: checksView(c.db, run.id),
    bottleneckTokensPerS: plan?.bottleneckTokensPerS ?? null,
    message: run.error,
    createdAt: run.created_at,
    startedAt: run.started_at,
    finishedAt: run.finished_at,
  };
}

function checksView(db: OrchestratorDb, runId: string): RunView['checks'] {
  const byMiner = new Map<string, RunView['checks'][number]>();
  for (const r of db.checkSummary(runId)) {
    let v = byMiner.get(r.miner_id);
    if (!v) byMiner.set(r.miner_id, (v = { miner: r.miner_id, name: db.miner(r.miner_id)?.name ?? null, passed: 0, failed: 0, open: 0 }));
    if (r.status === 'passed') v.passed += r.n;
    else if (r.status === 'failed') v.failed += r.n;
    else if (r.status === 'asked') v.open += r.n;
  }
  return [...byMiner.values()];
}

/** The whole model from the stages' latest states, as one safetensors checkpoint. */
export async function assembleCheckpoint(c: Coordinator, runId: string): Promise<Uint8Array> {
  const run = c.db.run(runId);
  if (!run) throw new CoordinatorError(404, `unknown run ${runId}`);
  const stages = c.db.stages(runId);
  if (stages.length === 0 || stages.some((s) => !s.state_blob)) throw new CoordinatorError(409, `run ${runId} has no merged state for every stage yet`);
  const config = gptConfig(run.model);
  const tensors: NamedTensor[] = [];
  let round = Infinity;
  for (const s of stages) {
    const file = decodeSafetensors(await c.blobs.get(s.state_blob!));
    const info = checkpointInfo(file);
    round = Math.min(round, info.step);
    for (const t of file.tensors.values()) if (!t.name.startsWith('outer.')) tensors.push(t);
  }
  return encodeSafetensors(tensors, {
    format: CHECKPOINT_FORMAT,
    config: JSON.stringify(config),
    from: '0',
    to: String(partCount(config)),
    step: String(run.microbatches_done),
    run: run.id,
    rounds: String(round),
  });
}

export interface EpochView {
  id: number;
  status: EpochRow['status'];
  runId: string | null;
  /** work_log ids (from, to] */
  workLog: [number, number | null];
  openedAt: number;
  closedAt: number | null;
  /** NIM, decimal strings */
  emission: string | null;
  remainder: string | null;
  chainId: number | null;
  chainEpoch: string | null;
  txHash: string | null;
  settledAt: number | null;
  error: string | null;
  rewards: { miner: string; name: string | null; score: number; amount: string; amountWei: string; units: Record<string, number> }[];
  /** stakes slashed for failed spot checks in this epoch */
  slashes: { miner: string; failed: number; amount: string | null; amountWei: string | null; status: string; txHash: string | null; reason: string; error: string | null }[];
}

export function epochView(db: OrchestratorDb, e: EpochRow): EpochView {
  return {
    id: e.id,
    status: e.status,
    runId: e.run_id,
    workLog: [e.from_log, e.to_log],
    openedAt: e.opened_at,
    closedAt: e.closed_at,
    emission: e.emission === null ? null : formatEther(BigInt(e.emission)),
    remainder: e.remainder === null ? null : formatEther(BigInt(e.remainder)),
    chainId: e.chain_id,
    chainEpoch: e.chain_epoch,
    txHash: e.tx_hash,
    settledAt: e.settled_at,
    error: e.error,
    rewards: db.epochRewards(e.id).map((r) => ({
      miner: r.miner,
      name: db.miner(r.miner)?.name ?? null,
      score: r.score,
      amount: formatEther(BigInt(r.amount)),
      amountWei: r.amount,
      units: JSON.parse(r.units) as Record<string, number>,
    })),
    slashes: db.slashes().filter((x) => x.epoch === e.id).map((x) => ({
      miner: x.miner,
      failed: x.failed,
      amount: x.amount === null ? null : formatEther(BigInt(x.amount)),
      amountWei: x.amount,
      status: x.status,
      txHash: x.tx_hash,
      reason: x.reason,
      error: x.error,
    })),
  };
}
