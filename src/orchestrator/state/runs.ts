// Runs, their stages and who holds each stage (assignments).
//
// Run status: waiting → started (planned) → executing (first microbatch
// issued) ⇄ merging (a merge round is open) → completed, or → cancelled by
// its owner at any point; `message` says why a run waits or stalls. A stage is 'training' or 'merging'; `round` counts
// the merge rounds it completed and `stateBlob` is its state after the last.
import { Type, type Static } from '@sinclair/typebox';
import { FINAL_RUN_STATUSES, RunStatus, StageMode } from '../../api/schemas.ts';
import { Plan } from '../../planner/types.ts';
import { ActivationCodec, Aggregator } from '../../protocol/messages.ts';
import { all, jsonColumn, one, rowReader, scalar, type Migrations, type StateDb } from './db.ts';

export const RUN_MIGRATIONS: Migrations = {
  store: 'runs',
  steps: [
    `CREATE TABLE IF NOT EXISTS runs (
      id TEXT PRIMARY KEY, model TEXT NOT NULL, data TEXT NOT NULL, status TEXT NOT NULL,
      steps INTEGER NOT NULL, batch_size INTEGER NOT NULL, merge_every INTEGER NOT NULL, seed INTEGER NOT NULL,
      stage_count INTEGER NOT NULL, plan TEXT NOT NULL, options TEXT NOT NULL,
      microbatches_done INTEGER NOT NULL DEFAULT 0, merges_done INTEGER NOT NULL DEFAULT 0,
      tokens_done INTEGER NOT NULL DEFAULT 0, bytes_sent INTEGER NOT NULL DEFAULT 0, last_loss REAL,
      created_at INTEGER NOT NULL, started_at INTEGER, finished_at INTEGER, error TEXT
    );
    CREATE TABLE IF NOT EXISTS stages (
      run_id TEXT NOT NULL, stage INTEGER NOT NULL, from_part INTEGER NOT NULL, to_part INTEGER NOT NULL,
      mode TEXT NOT NULL, round INTEGER NOT NULL DEFAULT 0, state_blob TEXT, inner_steps INTEGER NOT NULL DEFAULT 0,
      last_loss REAL,
      PRIMARY KEY (run_id, stage)
    );
    CREATE TABLE IF NOT EXISTS assignments (
      run_id TEXT NOT NULL, stage INTEGER NOT NULL, miner_id TEXT NOT NULL, assigned_at INTEGER NOT NULL,
      PRIMARY KEY (run_id, miner_id)
    )`,
    // the count of microbatches created was kept inside the options JSON
    moveCreatedCount,
    // the developer who created it (null: created before runs were signed)
    'ALTER TABLE runs ADD COLUMN owner TEXT',
  ],
};

/** Step 2: the count of microbatches created moves out of the options JSON into its own column (read and rewritten here, on either engine). */
function moveCreatedCount(db: StateDb): void {
  db.exec('ALTER TABLE runs ADD COLUMN microbatches_created INTEGER NOT NULL DEFAULT 0');
  const rows = db.statement('SELECT id, options FROM runs').all() as { id: string; options: string }[];
  const update = db.statement('UPDATE runs SET microbatches_created = ?, options = ? WHERE id = ?');
  for (const r of rows) {
    let options: unknown;
    try {
      options = JSON.parse(r.options);
    } catch {
      continue; // options that do not decode stay as they are: reading the run reports them as corrupt
    }
    if (typeof options !== 'object' || options === null || Array.isArray(options)) continue;
    const { created, ...rest } = options as Record<string, unknown>;
    update.run(typeof created === 'number' ? created : 0, JSON.stringify(rest), r.id);
  }
}

/** A run's training settings, fixed when it is created. */
export const RunOptions = Type.Object({
  lr: Type.Number({ exclusiveMinimum: 0 }),
  codec: ActivationCodec,
  aggregator: Aggregator,
  minMiners: Type.Integer({ minimum: 1 }),
  outerLr: Type.Number({ exclusiveMinimum: 0 }),
  outerMomentum: Type.Number({ minimum: 0, maximum: 1 }),
  /** the stage count the developer asked for (null: the planner chooses) */
  requestedStages: Type.Union([Type.Integer({ minimum: 1 }), Type.Null()]),
  /** the only miners the run may be placed on (a job's chosen miners; absent: any free miner) */
  pool: Type.Optional(Type.Array(Type.String())),
  /** the whole-model checkpoint (blob id) its stages start from, with no outer momentum (absent: the model's seeded init) */
  init: Type.Optional(Type.String({ pattern: '^[0-9a-f]{64}$' })),
  /** its microbatch n trains on shard shardBase + n (a job's later run goes on where the earlier ones stopped) */
  shardBase: Type.Optional(Type.Integer({ minimum: 0 })),
});
export type RunOptions = Static<typeof RunOptions>;

/** The statuses of ended runs, as SQL. */
const ENDED = `(${FINAL_RUN_STATUSES.map((st) => `'${st}'`).join(', ')})`;

const Int = Type.Integer({ minimum: 0 });
const NullableInt = Type.Union([Int, Type.Null()]);
const NullableNumber = Type.Union([Type.Number(), Type.Null()]);

const RunRow = Type.Object({
  id: Type.String(),
  model: Type.String(),
  data: Type.String(),
  status: RunStatus,
  steps: Int,
  batchSize: Int,
  mergeEvery: Int,
  seed: Int,
  stageCount: Int,
  plan: Type.String(),
  options: Type.String(),
  microbatchesCreated: Int,
  microbatchesDone: Int,
  mergesDone: Int,
  tokensDone: Int,
  bytesSent: Int,
  lastLoss: NullableNumber,
  createdAt: Int,
  startedAt: NullableInt,
  finishedAt: NullableInt,
  message: Type.Union([Type.String(), Type.Null()]),
  owner: Type.Union([Type.String(), Type.Null()]),
});

export interface RunRecord extends Omit<Static<typeof RunRow>, 'plan' | 'options'> {
  /** who holds which stage (null until the run is planned) */
  plan: Plan | null;
  options: RunOptions;
}

const RUN_COLUMNS = `id, model, data, status, steps, batch_size AS batchSize, merge_every AS mergeEvery, seed,
  stage_count AS stageCount, plan, options, microbatches_created AS microbatchesCreated,
  microbatches_done AS microbatchesDone, merges_done AS mergesDone, tokens_done AS tokensDone, bytes_sent AS bytesSent,
  last_loss AS lastLoss, created_at AS createdAt, started_at AS startedAt, finished_at AS finishedAt, error AS message, owner`;
const readRun = rowReader(RunRow, 'run');
const NullablePlan = Type.Union([Plan, Type.Null()]);
function decodeRun(row: unknown): RunRecord {
  const r = readRun(row);
  return { ...r, plan: jsonColumn(NullablePlan, r.plan, `plan of ${r.id}`), options: jsonColumn(RunOptions, r.options, `options of ${r.id}`) };
}

const StageRow = Type.Object({
  runId: Type.String(),
  stage: Int,
  fromPart: Int,
  toPart: Int,
  mode: StageMode,
  round: Int,
  stateBlob: Type.Union([Type.String({ pattern: '^[0-9a-f]{64}$' }), Type.Null()]),
  innerSteps: Int,
  lastLoss: NullableNumber,
});
export type StageRecord = Static<typeof StageRow>;
const STAGE_COLUMNS = 'run_id AS runId, stage, from_part AS fromPart, to_part AS toPart, mode, round, state_blob AS stateBlob, inner_steps AS innerSteps, last_loss AS lastLoss';
const decodeStage = rowReader(StageRow, 'stage');

const AssignmentRow = Type.Object({ runId: Type.String(), stage: Int, minerId: Type.String(), assignedAt: Int });
export type AssignmentRecord = Static<typeof AssignmentRow>;
const ASSIGNMENT_COLUMNS = 'run_id AS runId, stage, miner_id AS minerId, assigned_at AS assignedAt';
const decodeAssignment = rowReader(AssignmentRow, 'assignment');

/** What a new run is created with. */
export interface NewRun {
  id: string;
  /** the developer who signed the request */
  owner: string;
  model: string;
  data: string;
  steps: number;
  batchSize: number;
  mergeEvery: number;
  seed: number;
  options: RunOptions;
}

/** Counters added as work completes. */
export interface RunCounters {
  microbatches?: number;
  tokens?: number;
  bytes?: number;
  merges?: number;
}

export class RunStore {
  constructor(private readonly db: StateDb) {}

  // ---- runs --------------------------------------------------------------------

  insert(r: NewRun, now: number): void {
    this.db.run(
      `INSERT INTO runs (id, owner, model, data, status, steps, batch_size, merge_every, seed, stage_count, plan, options, created_at)
       VALUES (@id, @owner, @model, @data, 'waiting', @steps, @batchSize, @mergeEvery, @seed, 0, 'null', @options, @now)`,
      { id: r.id, owner: r.owner, model: r.model, data: r.data, steps: r.steps, batchSize: r.batchSize, mergeEvery: r.mergeEvery, seed: r.seed, options: JSON.stringify(r.options), now },
    );
  }

  get(id: string): RunRecord | undefined {
    return one(this.db, decodeRun, `SELECT ${RUN_COLUMNS} FROM runs WHERE id = ?`, id);
  }

  list(): RunRecord[] {
    return all(this.db, decodeRun, `SELECT ${RUN_COLUMNS} FROM runs ORDER BY created_at, rowid`);
  }

  /** Runs that have not ended (completed, failed, cancelled), oldest first. */
  active(): RunRecord[] {
    return all(this.db, decodeRun, `SELECT ${RUN_COLUMNS} FROM runs WHERE status NOT IN ${ENDED} ORDER BY created_at, rowid`);
  }

  /** Runs that have not ended, of one owner. */
  activeOf(owner: string): RunRecord[] {
    return all(this.db, decodeRun, `SELECT ${RUN_COLUMNS} FROM runs WHERE owner = ? AND status NOT IN ${ENDED} ORDER BY created_at, rowid`, owner);
  }

  /** Runs waiting for miners. */
  countWaiting(): number {
    return scalar(this.db, "SELECT COUNT(*) AS n FROM runs WHERE status = 'waiting'");
  }

  /** Why the run waits or stalls (null: it does not). */
  setMessage(id: string, message: string | null): void {
    this.db.run('UPDATE runs SET error = ? WHERE id = ?', message, id);
  }

  /** waiting → started: planned onto miners. */
  start(id: string, plan: Plan, now: number): void {
    this.db.run(
      "UPDATE runs SET status = 'started', stage_count = ?, plan = ?, started_at = COALESCE(started_at, ?), error = NULL WHERE id = ?",
      plan.stages.length,
      JSON.stringify(plan),
      now,
      id,
    );
  }

  /** New training settings (the pool of miners a job's run may use). */
  setOptions(id: string, options: RunOptions): void {
    this.db.run('UPDATE runs SET options = ? WHERE id = ?', JSON.stringify(options), id);
  }

  /** A new plan after miners came or went (same stages). */
  setPlan(id: string, plan: Plan): void {
    this.db.run('UPDATE runs SET plan = ? WHERE id = ?', JSON.stringify(plan), id);
  }

  /** started → executing, executing ⇄ merging. */
  setStatus(id: string, status: 'executing' | 'merging'): void {
    this.db.run('UPDATE runs SET status = ? WHERE id = ?', status, id);
  }

  complete(id: string, now: number): void {
    this.db.run("UPDATE runs SET status = 'completed', finished_at = ? WHERE id = ?", now, id);
  }

  /** → cancelled (by its owner): its assignments are let go. */
  cancel(id: string, now: number): void {
    this.db.run("UPDATE runs SET status = 'cancelled', finished_at = ?, error = 'cancelled by its owner' WHERE id = ?", now, id);
    this.db.run('DELETE FROM assignments WHERE run_id = ?', id);
  }

  /** Microbatches created so far (shard ids 0 … n − 1). */
  /** The run is to end after `steps` microbatches (at least those created: they are issued or done). */
  setSteps(id: string, steps: number): void {
    this.db.run('UPDATE runs SET steps = MAX(?, microbatches_created, 1) WHERE id = ?', steps, id);
  }

  setCreated(id: string, n: number): void {
    this.db.run('UPDATE runs SET microbatches_created = ? WHERE id = ?', n, id);
  }

  recordLoss(id: string, loss: number): void {
    this.db.run('UPDATE runs SET last_loss = ? WHERE id = ?', loss, id);
  }

  addCounters(id: string, c: RunCounters): void {
    this.db.run(
      `UPDATE runs SET microbatches_done = microbatches_done + @m, tokens_done = tokens_done + @t,
       bytes_sent = bytes_sent + @b, merges_done = merges_done + @g WHERE id = @id`,
      { id, m: c.microbatches ?? 0, t: c.tokens ?? 0, b: c.bytes ?? 0, g: c.merges ?? 0 },
    );
  }

  // ---- stages --------------------------------------------------------------------

  insertStages(runId: string, ranges: readonly { from: number; to: number }[]): void {
    ranges.forEach((r, stage) => {
      this.db.run("INSERT INTO stages (run_id, stage, from_part, to_part, mode) VALUES (?, ?, ?, ?, 'training')", runId, stage, r.from, r.to);
    });
  }

  stages(runId: string): StageRecord[] {
    return all(this.db, decodeStage, `SELECT ${STAGE_COLUMNS} FROM stages WHERE run_id = ? ORDER BY stage`, runId);
  }

  stage(runId: string, stage: number): StageRecord | undefined {
    return one(this.db, decodeStage, `SELECT ${STAGE_COLUMNS} FROM stages WHERE run_id = ? AND stage = ?`, runId, stage);
  }

  /** training → merging, when a merge round opens. */
  startMerging(runId: string, stage: number): void {
    this.db.run("UPDATE stages SET mode = 'merging' WHERE run_id = ? AND stage = ?", runId, stage);
  }

  /** merging → training: round `round` is done and `stateBlob` is the stage's state. */
  finishRound(runId: string, stage: number, round: number, stateBlob: string | null): void {
    this.db.run("UPDATE stages SET mode = 'training', round = ?, state_blob = ?, inner_steps = 0 WHERE run_id = ? AND stage = ?", round, stateBlob, runId, stage);
  }

  recordStageLoss(runId: string, stage: number, loss: number): void {
    this.db.run('UPDATE stages SET last_loss = ? WHERE run_id = ? AND stage = ?', loss, runId, stage);
  }

  /** Whether a stage's latest state is `blob` (kept for good: the run's checkpoint is made of them). */
  referencesBlob(blob: string): boolean {
    if (scalar(this.db, 'SELECT EXISTS (SELECT 1 FROM stages WHERE state_blob = ?) AS n', blob) === 1) return true;
    // the checkpoint an active run's stages start from
    return scalar(this.db, `SELECT EXISTS (SELECT 1 FROM runs WHERE status NOT IN ${ENDED} AND json_extract(options, '$.init') = ?) AS n`, blob) === 1;
  }

  /** A microbatch completed: one more inner step at every stage. */
  addInnerStep(runId: string): void {
    this.db.run('UPDATE stages SET inner_steps = inner_steps + 1 WHERE run_id = ?', runId);
  }

  // ---- assignments ---------------------------------------------------------------

  assign(runId: string, stage: number, minerId: string, now: number): void {
    this.db.run(
      `INSERT INTO assignments (run_id, stage, miner_id, assigned_at) VALUES (?, ?, ?, ?)
       ON CONFLICT(run_id, miner_id) DO UPDATE SET stage = excluded.stage, assigned_at = excluded.assigned_at`,
      runId,
      stage,
      minerId,
      now,
    );
  }

  unassign(runId: string, minerId: string): void {
    this.db.run('DELETE FROM assignments WHERE run_id = ? AND miner_id = ?', runId, minerId);
  }

  assignments(runId: string): AssignmentRecord[] {
    return all(this.db, decodeAssignment, `SELECT ${ASSIGNMENT_COLUMNS} FROM assignments WHERE run_id = ? ORDER BY stage, assigned_at, miner_id`, runId);
  }

  /** The stage a miner holds in an active run (the oldest, if several). */
  assignmentOf(minerId: string): AssignmentRecord | undefined {
    return one(
      this.db,
      decodeAssignment,
      `SELECT a.run_id AS runId, a.stage, a.miner_id AS minerId, a.assigned_at AS assignedAt FROM assignments a JOIN runs r ON r.id = a.run_id
       WHERE a.miner_id = ? AND r.status NOT IN ${ENDED} ORDER BY r.created_at, r.rowid LIMIT 1`,
      minerId,
    );
  }
}
