// The orchestrator's durable state: one SQLite file (WAL) in the data dir.
// Every table, and the only SQL, lives here; the rest of the orchestrator
// calls these typed functions.
import Database from 'better-sqlite3';

export type RunStatus = 'waiting' | 'started' | 'executing' | 'merging' | 'completed' | 'failed';
export type StageMode = 'training' | 'merging';
export type MicrobatchStatus = 'pending' | 'issued' | 'done' | 'dropped';
export type WorkKind = 'forward' | 'backward' | 'merge' | 'dropped' | 'invalid' | 'failed_check';
export type SpotCheckStatus = 'asked' | 'passed' | 'failed' | 'skipped';
export type SlashStatus = 'pending' | 'slashed' | 'skipped';

/** What a miner committed to when it reported a forward. */
export interface ForwardCommitRow {
  microbatch: number;
  stage: number;
  miner_id: string;
  output_sha: string | null;
  input_sha: string | null;
  loss: number | null;
  at: number;
}

export interface SpotCheckRow {
  id: number;
  run_id: string;
  microbatch: number;
  stage: number;
  miner_id: string;
  status: SpotCheckStatus;
  created_at: number;
  decided_at: number | null;
  cosine: number | null;
  norm_ratio: number | null;
  detail: string | null;
}

export interface SlashRow {
  epoch: number;
  miner: string;
  /** failed checks in the epoch */
  failed: number;
  /** share of the stake to slash */
  fraction: number;
  /** wei (decimal string), fixed before the first send */
  amount: string | null;
  /** the on-chain reason, unique per (epoch, miner): how a resend finds an earlier slash */
  reason: string;
  status: SlashStatus;
  tx_hash: string | null;
  error: string | null;
}

export type EpochStatus = 'open' | 'settling' | 'settled';

export interface EpochRow {
  id: number;
  /** the run whose merge rounds (or end) closed the epoch */
  run_id: string | null;
  /** work_log ids in (from_log, to_log] */
  from_log: number;
  to_log: number | null;
  opened_at: number;
  closed_at: number | null;
  /** merge rounds of run_id done when it closed */
  merges_mark: number;
  status: EpochStatus;
  /** wei, decimal strings */
  emission: string | null;
  remainder: string | null;
  chain_id: number | null;
  /** the epoch id used on chain (decimal string) */
  chain_epoch: string | null;
  tx_hash: string | null;
  settled_at: number | null;
  error: string | null;
}

export interface EpochRewardRow {
  epoch: number;
  miner: string;
  score: number;
  /** wei, decimal string */
  amount: string;
  /** JSON: units per kind */
  units: string;
}

export interface MinerRow {
  id: string; // checksummed address
  name: string;
  url: string;
  gflops: number;
  threads: number;
  memory_bytes: number;
  bandwidth_mbps: number;
  joined_at: number;
  last_seen: number;
  alive: number;
}

export interface RunRow {
  id: string;
  model: string;
  data: string;
  status: RunStatus;
  steps: number; // microbatches to train
  batch_size: number;
  merge_every: number; // H: inner steps per replica between merges
  seed: number;
  stage_count: number;
  plan: string; // JSON of the placement plan
  options: string; // JSON of the remaining run options
  microbatches_done: number;
  merges_done: number;
  tokens_done: number;
  bytes_sent: number;
  last_loss: number | null;
  created_at: number;
  started_at: number | null;
  finished_at: number | null;
  error: string | null;
}

export interface StageRow {
  run_id: string;
  stage: number;
  from_part: number;
  to_part: number;
  mode: StageMode;
  round: number; // merge rounds completed
  state_blob: string | null; // weights + outer momentum after the last merge
  inner_steps: number; // microbatches since the last merge
  last_loss: number | null;
}

export interface AssignmentRow {
  run_id: string;
  stage: number;
  miner_id: string;
  assigned_at: number;
}

export interface MicrobatchRow {
  id: number;
  run_id: string;
  shard: number;
  step: number;
  status: MicrobatchStatus;
  miner_id: string | null;
  path: string | null; // JSON: miner ids, one per stage, as far as it got
  progress: number; // hops reported: forward stages done + backward stages done
  issued_at: number | null;
  deadline: number | null;
  attempts: number;
  loss: number | null;
}

export interface MergeRoundRow {
  run_id: string;
  stage: number;
  round: number;
  status: 'uploading' | 'merging' | 'applying' | 'done';
  partitions: number;
  replicas: string; // JSON miner ids taking part
  assignment: string; // JSON: partition -> merger ids
  started_at: number;
  state_blob: string | null; // the stage state uploaded after applying
}

const SCHEMA = `
CREATE TABLE IF NOT EXISTS miners (
  id TEXT PRIMARY KEY, name TEXT NOT NULL, url TEXT NOT NULL,
  gflops REAL NOT NULL, threads INTEGER NOT NULL, memory_bytes INTEGER NOT NULL, bandwidth_mbps REAL NOT NULL,
  joined_at INTEGER NOT NULL, last_seen INTEGER NOT NULL, alive INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS runs (
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
);
CREATE TABLE IF NOT EXISTS microbatches (
  id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, shard INTEGER NOT NULL, step INTEGER NOT NULL,
  status TEXT NOT NULL, miner_id TEXT, path TEXT, progress INTEGER NOT NULL DEFAULT 0,
  issued_at INTEGER, deadline INTEGER, attempts INTEGER NOT NULL DEFAULT 0, loss REAL
);
CREATE INDEX IF NOT EXISTS microbatches_by_status ON microbatches (run_id, status);
CREATE TABLE IF NOT EXISTS merge_rounds (
  run_id TEXT NOT NULL, stage INTEGER NOT NULL, round INTEGER NOT NULL, status TEXT NOT NULL,
  partitions INTEGER NOT NULL, replicas TEXT NOT NULL, assignment TEXT NOT NULL, started_at INTEGER NOT NULL,
  state_blob TEXT,
  PRIMARY KEY (run_id, stage, round)
);
CREATE TABLE IF NOT EXISTS merge_uploads (
  run_id TEXT NOT NULL, stage INTEGER NOT NULL, round INTEGER NOT NULL, miner_id TEXT NOT NULL,
  partition INTEGER NOT NULL, blob TEXT NOT NULL, samples INTEGER NOT NULL,
  PRIMARY KEY (run_id, stage, round, miner_id, partition)
);
CREATE TABLE IF NOT EXISTS merge_results (
  run_id TEXT NOT NULL, stage INTEGER NOT NULL, round INTEGER NOT NULL, partition INTEGER NOT NULL,
  miner_id TEXT NOT NULL, blob TEXT NOT NULL,
  PRIMARY KEY (run_id, stage, round, partition, miner_id)
);
CREATE TABLE IF NOT EXISTS work_log (
  id INTEGER PRIMARY KEY AUTOINCREMENT, miner_id TEXT NOT NULL, run_id TEXT, kind TEXT NOT NULL,
  units REAL NOT NULL, stage INTEGER, at INTEGER NOT NULL, detail TEXT
);
CREATE INDEX IF NOT EXISTS work_by_miner ON work_log (miner_id, kind);
CREATE TABLE IF NOT EXISTS epochs (
  id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT, from_log INTEGER NOT NULL, to_log INTEGER,
  opened_at INTEGER NOT NULL, closed_at INTEGER, merges_mark INTEGER NOT NULL DEFAULT 0, status TEXT NOT NULL,
  emission TEXT, remainder TEXT, chain_id INTEGER, chain_epoch TEXT, tx_hash TEXT, settled_at INTEGER, error TEXT
);
CREATE TABLE IF NOT EXISTS forward_commits (
  microbatch INTEGER NOT NULL, stage INTEGER NOT NULL, miner_id TEXT NOT NULL, output_sha TEXT, input_sha TEXT, loss REAL,
  at INTEGER NOT NULL, PRIMARY KEY (microbatch, stage, miner_id)
);
CREATE INDEX IF NOT EXISTS forward_commits_by_time ON forward_commits (at);
CREATE TABLE IF NOT EXISTS spot_checks (
  id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, microbatch INTEGER NOT NULL, stage INTEGER NOT NULL,
  miner_id TEXT NOT NULL, status TEXT NOT NULL, created_at INTEGER NOT NULL, decided_at INTEGER,
  cosine REAL, norm_ratio REAL, detail TEXT
);
CREATE INDEX IF NOT EXISTS spot_checks_by_miner ON spot_checks (miner_id, status);
CREATE INDEX IF NOT EXISTS spot_checks_by_status ON spot_checks (status, created_at);
CREATE TABLE IF NOT EXISTS slashes (
  epoch INTEGER NOT NULL, miner TEXT NOT NULL, failed INTEGER NOT NULL, fraction REAL NOT NULL, amount TEXT,
  reason TEXT NOT NULL, status TEXT NOT NULL, tx_hash TEXT, error TEXT,
  PRIMARY KEY (epoch, miner)
);
CREATE TABLE IF NOT EXISTS epoch_rewards (
  epoch INTEGER NOT NULL, miner TEXT NOT NULL, score REAL NOT NULL, amount TEXT NOT NULL, units TEXT NOT NULL,
  PRIMARY KEY (epoch, miner)
);
`;

export class OrchestratorDb {
  readonly sql: Database.Database;

  constructor(path: string) {
    this.sql = new Database(path);
    this.sql.pragma('journal_mode = WAL');
    this.sql.pragma('synchronous = NORMAL');
    this.sql.pragma('busy_timeout = 5000');
    this.sql.exec(SCHEMA);
  }

  close(): void {
    this.sql.close();
  }

  /** Runs fn in one transaction. */
  tx<T>(fn: () => T): T {
    return this.sql.transaction(fn)();
  }

  // ---- miners -------------------------------------------------------------

  upsertMiner(m: Omit<MinerRow, 'joined_at' | 'last_seen' | 'alive'>, now: number): void {
    this.sql
      .prepare(
        `INSERT INTO miners (id, name, url, gflops, threads, memory_bytes, bandwidth_mbps, joined_at, last_seen, alive)
         VALUES (@id, @name, @url, @gflops, @threads, @memory_bytes, @bandwidth_mbps, @now, @now, 1)
         ON CONFLICT(id) DO UPDATE SET name = @name, url = @url, gflops = @gflops, threads = @threads,
           memory_bytes = @memory_bytes, bandwidth_mbps = @bandwidth_mbps, last_seen = @now, alive = 1`,
      )
      .run({ ...m, now });
  }

  miner(id: string): MinerRow | undefined {
    return this.sql.prepare('SELECT * FROM miners WHERE id = ?').get(id) as MinerRow | undefined;
  }

  miners(aliveOnly = false): MinerRow[] {
    return this.sql.prepare(`SELECT * FROM miners ${aliveOnly ? 'WHERE alive = 1' : ''} ORDER BY joined_at, id`).all() as MinerRow[];
  }

  touchMiner(id: string, now: number): void {
    this.sql.prepare('UPDATE miners SET last_seen = ?, alive = 1 WHERE id = ?').run(now, id);
  }

  markMinerGone(id: string): void {
    this.sql.prepare('UPDATE miners SET alive = 0 WHERE id = ?').run(id);
  }

  // ---- runs ---------------------------------------------------------------

  insertRun(r: Pick<RunRow, 'id' | 'model' | 'data' | 'steps' | 'batch_size' | 'merge_every' | 'seed' | 'stage_count' | 'plan' | 'options'>, now: number): void {
    this.sql
      .prepare(
        `INSERT INTO runs (id, model, data, status, steps, batch_size, merge_every, seed, stage_count, plan, options, created_at)
         VALUES (@id, @model, @data, 'waiting', @steps, @batch_size, @merge_every, @seed, @stage_count, @plan, @options, @now)`,
      )
      .run({ ...r, now });
  }

  run(id: string): RunRow | undefined {
    return this.sql.prepare('SELECT * FROM runs WHERE id = ?').get(id) as RunRow | undefined;
  }

  runs(): RunRow[] {
    return this.sql.prepare('SELECT * FROM runs ORDER BY created_at').all() as RunRow[];
  }

  activeRuns(): RunRow[] {
    return this.sql.prepare("SELECT * FROM runs WHERE status NOT IN ('completed', 'failed') ORDER BY created_at").all() as RunRow[];
  }

  updateRun(id: string, fields: Partial<Omit<RunRow, 'id'>>): void {
    const keys = Object.keys(fields);
    if (keys.length === 0) return;
    this.sql.prepare(`UPDATE runs SET ${keys.map((k) => `${k} = @${k}`).join(', ')} WHERE id = @id`).run({ ...fields, id });
  }

  addRunCounters(id: string, c: { microbatches?: number; tokens?: number; bytes?: number; merges?: number }): void {
    this.sql
      .prepare(
        `UPDATE runs SET microbatches_done = microbatches_done + @m, tokens_done = tokens_done + @t,
         bytes_sent = bytes_sent + @b, merges_done = merges_done + @g WHERE id = @id`,
      )
      .run({ id, m: c.microbatches ?? 0, t: c.tokens ?? 0, b: c.bytes ?? 0, g: c.merges ?? 0 });
  }

  // ---- stages and assignments ---------------------------------------------

  insertStage(s: Pick<StageRow, 'run_id' | 'stage' | 'from_part' | 'to_part'>): void {
    this.sql
      .prepare(`INSERT INTO stages (run_id, stage, from_part, to_part, mode) VALUES (@run_id, @stage, @from_part, @to_part, 'training')`)
      .run(s);
  }

  stages(runId: string): StageRow[] {
    return this.sql.prepare('SELECT * FROM stages WHERE run_id = ? ORDER BY stage').all(runId) as StageRow[];
  }

  updateStage(runId: string, stage: number, fields: Partial<Omit<StageRow, 'run_id' | 'stage'>>): void {
    const keys = Object.keys(fields);
    if (keys.length === 0) return;
    this.sql
      .prepare(`UPDATE stages SET ${keys.map((k) => `${k} = @${k}`).join(', ')} WHERE run_id = @run_id AND stage = @stage`)
      .run({ ...fields, run_id: runId, stage });
  }

  assign(runId: string, stage: number, minerId: string, now: number): void {
    this.sql
      .prepare(
        `INSERT INTO assignments (run_id, stage, miner_id, assigned_at) VALUES (?, ?, ?, ?)
         ON CONFLICT(run_id, miner_id) DO UPDATE SET stage = excluded.stage, assigned_at = excluded.assigned_at`,
      )
      .run(runId, stage, minerId, now);
  }

  unassign(runId: string, minerId: string): void {
    this.sql.prepare('DELETE FROM assignments WHERE run_id = ? AND miner_id = ?').run(runId, minerId);
  }

  assignments(runId: string): AssignmentRow[] {
    return this.sql.prepare('SELECT * FROM assignments WHERE run_id = ? ORDER BY stage, assigned_at, miner_id').all(runId) as AssignmentRow[];
  }

  assignmentOf(minerId: string): AssignmentRow | undefined {
    return this.sql
      .prepare(
        `SELECT a.* FROM assignments a JOIN runs r ON r.id = a.run_id
         WHERE a.miner_id = ? AND r.status NOT IN ('completed', 'failed') ORDER BY r.created_at LIMIT 1`,
      )
      .get(minerId) as AssignmentRow | undefined;
  }

  // ---- microbatches ---------------------------------------------------------

  insertMicrobatch(runId: string, shard: number, step: number): number {
    return Number(this.sql.prepare(`INSERT INTO microbatches (run_id, shard, step, status) VALUES (?, ?, ?, 'pending')`).run(runId, shard, step).lastInsertRowid);
  }

  microbatch(id: number): MicrobatchRow | undefined {
    return this.sql.prepare('SELECT * FROM microbatches WHERE id = ?').get(id) as MicrobatchRow | undefined;
  }

  microbatchesByStatus(runId: string, status: MicrobatchStatus, limit = 1_000_000): MicrobatchRow[] {
    return this.sql.prepare('SELECT * FROM microbatches WHERE run_id = ? AND status = ? ORDER BY id LIMIT ?').all(runId, status, limit) as MicrobatchRow[];
  }

  countMicrobatches(runId: string, status: MicrobatchStatus): number {
    return (this.sql.prepare('SELECT COUNT(*) AS n FROM microbatches WHERE run_id = ? AND status = ?').get(runId, status) as { n: number }).n;
  }

  issuedTo(minerId: string): MicrobatchRow[] {
    return this.sql.prepare(`SELECT * FROM microbatches WHERE miner_id = ? AND status = 'issued' ORDER BY id`).all(minerId) as MicrobatchRow[];
  }

  updateMicrobatch(id: number, fields: Partial<Omit<MicrobatchRow, 'id'>>): void {
    const keys = Object.keys(fields);
    if (keys.length === 0) return;
    this.sql.prepare(`UPDATE microbatches SET ${keys.map((k) => `${k} = @${k}`).join(', ')} WHERE id = @id`).run({ ...fields, id });
  }

  // ---- merges ---------------------------------------------------------------

  insertMergeRound(r: Omit<MergeRoundRow, 'state_blob'>): void {
    this.sql
      .prepare(
        `INSERT OR REPLACE INTO merge_rounds (run_id, stage, round, status, partitions, replicas, assignment, started_at)
         VALUES (@run_id, @stage, @round, @status, @partitions, @replicas, @assignment, @started_at)`,
      )
      .run(r);
  }

  mergeRound(runId: string, stage: number, round: number): MergeRoundRow | undefined {
    return this.sql.prepare('SELECT * FROM merge_rounds WHERE run_id = ? AND stage = ? AND round = ?').get(runId, stage, round) as MergeRoundRow | undefined;
  }

  updateMergeRound(runId: string, stage: number, round: number, fields: Partial<Pick<MergeRoundRow, 'status' | 'replicas' | 'assignment' | 'state_blob'>>): void {
    const keys = Object.keys(fields);
    if (keys.length === 0) return;
    this.sql
      .prepare(`UPDATE merge_rounds SET ${keys.map((k) => `${k} = @${k}`).join(', ')} WHERE run_id = @run_id AND stage = @stage AND round = @round`)
      .run({ ...fields, run_id: runId, stage, round });
  }

  putMergeUpload(u: { run_id: string; stage: number; round: number; miner_id: string; partition: number; blob: string; samples: number }): void {
    this.sql
      .prepare(
        `INSERT OR REPLACE INTO merge_uploads (run_id, stage, round, miner_id, partition, blob, samples)
         VALUES (@run_id, @stage, @round, @miner_id, @partition, @blob, @samples)`,
      )
      .run(u);
  }

  mergeUploads(runId: string, stage: number, round: number): { miner_id: string; partition: number; blob: string; samples: number }[] {
    return this.sql
      .prepare('SELECT miner_id, partition, blob, samples FROM merge_uploads WHERE run_id = ? AND stage = ? AND round = ? ORDER BY partition, miner_id')
      .all(runId, stage, round) as { miner_id: string; partition: number; blob: string; samples: number }[];
  }

  putMergeResult(r: { run_id: string; stage: number; round: number; partition: number; miner_id: string; blob: string }): void {
    this.sql
      .prepare(
        `INSERT OR REPLACE INTO merge_results (run_id, stage, round, partition, miner_id, blob)
         VALUES (@run_id, @stage, @round, @partition, @miner_id, @blob)`,
      )
      .run(r);
  }

  mergeResults(runId: string, stage: number, round: number): { partition: number; miner_id: string; blob: string }[] {
    return this.sql
      .prepare('SELECT partition, miner_id, blob FROM merge_results WHERE run_id = ? AND stage = ? AND round = ? ORDER BY partition, miner_id')
      .all(runId, stage, round) as { partition: number; miner_id: string; blob: string }[];
  }

  // ---- work log ---------------------------------------------------------------

  logWork(minerId: string, runId: string | null, kind: WorkKind, units: number, now: number, stage: number | null = null, detail: string | null = null): void {
    this.sql
      .prepare('INSERT INTO work_log (miner_id, run_id, kind, units, stage, at, detail) VALUES (?, ?, ?, ?, ?, ?, ?)')
      .run(minerId, runId, kind, units, stage, now, detail);
  }

  workSummary(runId?: string): { miner_id: string; kind: WorkKind; units: number }[] {
    return this.sql
      .prepare(`SELECT miner_id, kind, SUM(units) AS units FROM work_log ${runId ? 'WHERE run_id = ?' : ''} GROUP BY miner_id, kind ORDER BY miner_id, kind`)
      .all(...(runId ? [runId] : [])) as { miner_id: string; kind: WorkKind; units: number }[];
  }

  lastWorkId(): number {
    return (this.sql.prepare('SELECT COALESCE(MAX(id), 0) AS n FROM work_log').get() as { n: number }).n;
  }

  workRows(fromExclusive: number, toInclusive: number): { id: number; miner_id: string; run_id: string | null; kind: WorkKind; units: number; stage: number | null }[] {
    return this.sql
      .prepare('SELECT id, miner_id, run_id, kind, units, stage FROM work_log WHERE id > ? AND id <= ? ORDER BY id')
      .all(fromExclusive, toInclusive) as { id: number; miner_id: string; run_id: string | null; kind: WorkKind; units: number; stage: number | null }[];
  }

  /** Work of `runId` logged after work_log id `after`. */
  countWorkAfter(after: number, runId: string): number {
    return (this.sql.prepare('SELECT COUNT(*) AS n FROM work_log WHERE id > ? AND run_id = ?').get(after, runId) as { n: number }).n;
  }

  // ---- spot checks ----------------------------------------------------------------

  putForwardCommit(c: ForwardCommitRow): void {
    this.sql
      .prepare(
        `INSERT OR REPLACE INTO forward_commits (microbatch, stage, miner_id, output_sha, input_sha, loss, at)
         VALUES (@microbatch, @stage, @miner_id, @output_sha, @input_sha, @loss, @at)`,
      )
      .run(c);
  }

  /** The commitments reported for a microbatch at a stage (several when it was re-issued), newest first. */
  forwardCommits(microbatch: number, stage: number): ForwardCommitRow[] {
    return this.sql.prepare('SELECT * FROM forward_commits WHERE microbatch = ? AND stage = ? ORDER BY at DESC').all(microbatch, stage) as ForwardCommitRow[];
  }

  deleteForwardCommitsBefore(at: number): void {
    this.sql.prepare('DELETE FROM forward_commits WHERE at < ?').run(at);
  }

  insertSpotCheck(c: Pick<SpotCheckRow, 'run_id' | 'microbatch' | 'stage' | 'miner_id' | 'created_at'>): number {
    return Number(
      this.sql
        .prepare(`INSERT INTO spot_checks (run_id, microbatch, stage, miner_id, status, created_at) VALUES (@run_id, @microbatch, @stage, @miner_id, 'asked', @created_at)`)
        .run(c).lastInsertRowid,
    );
  }

  /** The open check of `microbatch` asked of `minerId`. */
  askedCheck(minerId: string, runId: string, microbatch: number): SpotCheckRow | undefined {
    return this.sql
      .prepare("SELECT * FROM spot_checks WHERE miner_id = ? AND run_id = ? AND microbatch = ? AND status = 'asked' ORDER BY id DESC LIMIT 1")
      .get(minerId, runId, microbatch) as SpotCheckRow | undefined;
  }

  checksAskedBefore(at: number): SpotCheckRow[] {
    return this.sql.prepare("SELECT * FROM spot_checks WHERE status = 'asked' AND created_at < ? ORDER BY id").all(at) as SpotCheckRow[];
  }

  decideCheck(id: number, fields: Pick<SpotCheckRow, 'status' | 'decided_at' | 'cosine' | 'norm_ratio' | 'detail'>): void {
    this.sql
      .prepare('UPDATE spot_checks SET status = @status, decided_at = @decided_at, cosine = @cosine, norm_ratio = @norm_ratio, detail = @detail WHERE id = @id')
      .run({ ...fields, id });
  }

  spotChecks(): SpotCheckRow[] {
    return this.sql.prepare('SELECT * FROM spot_checks ORDER BY id').all() as SpotCheckRow[];
  }

  /** Checks per miner and status, optionally for one run. */
  checkSummary(runId?: string): { miner_id: string; status: SpotCheckStatus; n: number }[] {
    return this.sql
      .prepare(`SELECT miner_id, status, COUNT(*) AS n FROM spot_checks ${runId ? 'WHERE run_id = ?' : ''} GROUP BY miner_id, status ORDER BY miner_id, status`)
      .all(...(runId ? [runId] : [])) as { miner_id: string; status: SpotCheckStatus; n: number }[];
  }

  // ---- slashes --------------------------------------------------------------------

  putSlash(r: Omit<SlashRow, 'amount' | 'status' | 'tx_hash' | 'error'>): void {
    this.sql
      .prepare(
        `INSERT OR IGNORE INTO slashes (epoch, miner, failed, fraction, reason, status) VALUES (@epoch, @miner, @failed, @fraction, @reason, 'pending')`,
      )
      .run(r);
  }

  slashes(status?: SlashStatus): SlashRow[] {
    return this.sql.prepare(`SELECT * FROM slashes ${status ? 'WHERE status = ?' : ''} ORDER BY epoch, miner`).all(...(status ? [status] : [])) as SlashRow[];
  }

  updateSlash(epoch: number, miner: string, fields: Partial<Pick<SlashRow, 'amount' | 'status' | 'tx_hash' | 'error'>>): void {
    const keys = Object.keys(fields);
    if (keys.length === 0) return;
    this.sql.prepare(`UPDATE slashes SET ${keys.map((k) => `${k} = @${k}`).join(', ')} WHERE epoch = @epoch AND miner = @miner`).run({ ...fields, epoch, miner });
  }

  // ---- epochs -------------------------------------------------------------------

  epoch(id: number): EpochRow | undefined {
    return this.sql.prepare('SELECT * FROM epochs WHERE id = ?').get(id) as EpochRow | undefined;
  }

  epochs(status?: EpochStatus): EpochRow[] {
    return this.sql.prepare(`SELECT * FROM epochs ${status ? 'WHERE status = ?' : ''} ORDER BY id`).all(...(status ? [status] : [])) as EpochRow[];
  }

  /** The open epoch (created on first use, starting after the last closed one). */
  openEpoch(now: number): EpochRow {
    const open = this.sql.prepare("SELECT * FROM epochs WHERE status = 'open' ORDER BY id DESC LIMIT 1").get() as EpochRow | undefined;
    if (open) return open;
    const last = this.sql.prepare('SELECT COALESCE(MAX(to_log), 0) AS n FROM epochs').get() as { n: number };
    const id = Number(this.sql.prepare("INSERT INTO epochs (from_log, opened_at, status) VALUES (?, ?, 'open')").run(last.n, now).lastInsertRowid);
    return this.epoch(id)!;
  }

  /** The last merges_mark recorded for a run (0 when no epoch was closed by it). */
  runMergesMark(runId: string): number {
    return (this.sql.prepare('SELECT COALESCE(MAX(merges_mark), 0) AS n FROM epochs WHERE run_id = ?').get(runId) as { n: number }).n;
  }

  updateEpoch(id: number, fields: Partial<Omit<EpochRow, 'id'>>): void {
    const keys = Object.keys(fields);
    if (keys.length === 0) return;
    this.sql.prepare(`UPDATE epochs SET ${keys.map((k) => `${k} = @${k}`).join(', ')} WHERE id = @id`).run({ ...fields, id });
  }

  putEpochReward(r: EpochRewardRow): void {
    this.sql
      .prepare('INSERT OR REPLACE INTO epoch_rewards (epoch, miner, score, amount, units) VALUES (@epoch, @miner, @score, @amount, @units)')
      .run(r);
  }

  epochRewards(epoch: number): EpochRewardRow[] {
    return this.sql.prepare('SELECT * FROM epoch_rewards WHERE epoch = ? ORDER BY miner').all(epoch) as EpochRewardRow[];
  }

  /** The highest on-chain epoch id used so far (0n when none). */
  maxChainEpoch(): bigint {
    const rows = this.sql.prepare('SELECT chain_epoch FROM epochs WHERE chain_epoch IS NOT NULL').all() as { chain_epoch: string }[];
    return rows.reduce((m, r) => (BigInt(r.chain_epoch) > m ? BigInt(r.chain_epoch) : m), 0n);
  }
}
