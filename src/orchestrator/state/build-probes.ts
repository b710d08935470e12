// The cross-build probes of model files (src/orchestrator/serving/build-probe.ts
// makes them): for each sha256 probed, every range of parts with the worst
// deviation the two kernel builds showed on it, and why the model is refused
// (null: it deploys). Kept so that a restarted orchestrator's checks use the
// same thresholds as before and no deployed model is probed again. A row is
// dropped with its model (src/orchestrator/blobs/store-budget.ts) or when the
// probe is made again. Deviations are finite in the row (a non-finite one,
// which refuses the model, is kept as the largest double: it refuses it still),
// and checked when read back.
import { Type, type Static } from '@sinclair/typebox';
import { all, jsonColumn, one, rowReader, type Migrations, type StateDb } from './db.ts';

export const BUILD_PROBE_MIGRATIONS: Migrations = {
  store: 'build_probes',
  steps: [`CREATE TABLE IF NOT EXISTS build_probes (sha256 TEXT PRIMARY KEY, ranges TEXT NOT NULL, refused TEXT, probed_at INTEGER NOT NULL)`],
};

const Deviation = Type.Number({ minimum: 0 });
const Range = Type.Object({ from: Type.Integer({ minimum: 0 }), to: Type.Integer({ minimum: 1 }), oneMinusCosine: Deviation, normDeviation: Deviation });
const Ranges = Type.Array(Range, { minItems: 1 });
export type StoredRange = Static<typeof Range>;

const Row = Type.Object({ sha256: Type.String({ pattern: '^[0-9a-f]{64}$' }), ranges: Type.String(), refused: Type.Union([Type.String(), Type.Null()]), probedAt: Type.Integer({ minimum: 0 }) });
const readRow = rowReader(Row, 'build probe');
const COLUMNS = 'sha256, ranges, refused, probed_at AS probedAt';

/** A stored probe: its ranges, why the model is refused (null: it deploys), and when it was made. */
export interface StoredProbe {
  sha256: string;
  ranges: StoredRange[];
  refused: string | null;
  probedAt: number;
}

function decode(row: unknown): StoredProbe {
  const r = readRow(row);
  return { sha256: r.sha256, ranges: jsonColumn(Ranges, r.ranges, `ranges of the build probe of ${r.sha256}`), refused: r.refused, probedAt: r.probedAt };
}

/** A deviation as the row keeps it: finite (Infinity and NaN become the largest double, which refuses a model as they do). */
function finite(x: number): number {
  return Number.isFinite(x) ? x : Number.MAX_VALUE;
}

export class BuildProbeStore {
  constructor(private readonly db: StateDb) {}

  get(sha256: string): StoredProbe | undefined {
    return one(this.db, decode, `SELECT ${COLUMNS} FROM build_probes WHERE sha256 = ?`, sha256);
  }

  /** Records a probe (replacing an earlier one of the same file). */
  put(p: { sha256: string; ranges: readonly StoredRange[]; refused: string | null }, now: number): void {
    const ranges = JSON.stringify(p.ranges.map((r) => ({ from: r.from, to: r.to, oneMinusCosine: finite(r.oneMinusCosine), normDeviation: finite(r.normDeviation) })));
    this.db.tx(() => {
      this.db.run('DELETE FROM build_probes WHERE sha256 = ?', p.sha256);
      this.db.run('INSERT INTO build_probes (sha256, ranges, refused, probed_at) VALUES (?, ?, ?, ?)', p.sha256, ranges, p.refused, now);
    });
  }

  /** Drops a file's probe (its model was deleted). */
  forget(sha256: string): void {
    this.db.run('DELETE FROM build_probes WHERE sha256 = ?', sha256);
  }

  /** Every stored probe, oldest first. */
  list(): StoredProbe[] {
    return all(this.db, decode, `SELECT ${COLUMNS} FROM build_probes ORDER BY probed_at, sha256`);
  }
}
