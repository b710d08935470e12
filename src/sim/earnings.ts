// Work the simulated orchestrator credits, and the NIM it pays for it: rows
// in the shape of the real work log, scored per epoch with the real
// scoreEpoch and splitEmission (src/orchestrator/rewards/scoring.ts).
import type { WorkKind } from '../api/schemas.ts';
import { scoreEpoch, splitEmission, type WorkRow } from '../orchestrator/rewards/scoring.ts';

/** The run id the simulated work is logged under. */
export const SIM_RUN = 'run-sim';

/** Work units summed per (epoch, miner, kind, stage): what the real log holds row by row. */
export class WorkLedger {
  private readonly rows = new Map<string, { epoch: number; row: WorkRow }>();

  constructor(private readonly epochMs: number) {}

  log(at: number, minerId: string, kind: WorkKind, stage: number | null, units = 1): void {
    const epoch = Math.floor(at / this.epochMs);
    const key = `${epoch}|${minerId}|${kind}|${stage}`;
    const r = this.rows.get(key);
    if (r) r.row.units += units;
    else this.rows.set(key, { epoch, row: { minerId, runId: SIM_RUN, kind, units, stage } });
  }

  /** NIM (wei) paid to each miner over every epoch: each epoch's rows scored and `emission` split by score. */
  payouts(stageShares: number[], emission: bigint): Map<string, bigint> {
    const byEpoch = new Map<number, WorkRow[]>();
    for (const { epoch, row } of this.rows.values()) {
      let list = byEpoch.get(epoch);
      if (!list) byEpoch.set(epoch, (list = []));
      list.push(row);
    }
    const paid = new Map<string, bigint>();
    for (const rows of byEpoch.values()) {
      const scores = scoreEpoch(rows, { [SIM_RUN]: stageShares });
      for (const r of splitEmission(scores, emission).rewards) paid.set(r.miner, (paid.get(r.miner) ?? 0n) + r.amount);
    }
    return paid;
  }
}
