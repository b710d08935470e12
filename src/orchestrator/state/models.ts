// The model store's rows (src/orchestrator/models/models.ts fills it): whole-model
// checkpoints developers stored to publish, by sha256 (which is also their
// blob's id: the blob store is content-addressed). A row is never collected:
// its blob is not subject to checkpoint retention (src/orchestrator/blobs/gc.ts
// asks referencesBlob). The first owner to store a sha256 keeps it.
//
// A row names its model by reference (`model`: `gpt-micro`, `gpt:v…`,
// `mlp:…`, src/model/model-ref.ts), and `config` holds the config of that
// kind (a GPT's, or an MLP classifier's {inputs, hidden, classes}). Rows of
// the first version were all GPTs: the second step derives their reference
// from their stored config.
//
// A name is its first owner's (`model_names`): a model of another owner is
// refused under it (`name_taken`), as the ModelRegistry refuses it on chain,
// so `/v1` resolves a name to one owner. The third step gives each existing
// name to the owner who stored it first. A name stays its owner's after its
// models are deleted.
//
// Storage (src/orchestrator/blobs/store-budget.ts decides): the fourth step
// adds `kept_until` (paid for until then; 0: not paid) and `published_at`
// (seen on the registry: published models are not collected). An
// unpublished model is collected once its free retention after
// `created_at` and its paid time have both passed; its owner deletes it.
import { Type, type Static } from '@sinclair/typebox';
import { Value } from '@sinclair/typebox/value';
import { GptConfig } from '../../model/config.ts';
import { MlpConfig } from '../../model/mlp.ts';
import { parseModelRef } from '../../model/model-ref.ts';
import { wholeModelRef, type WholeModelConfig } from '../../model/whole-model.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { all, jsonColumn, one, rowReader, scalar, type Migrations, type StateDb } from './db.ts';

export const MODEL_MIGRATIONS: Migrations = {
  store: 'models',
  steps: [
    `CREATE TABLE IF NOT EXISTS models (
      sha256 TEXT PRIMARY KEY, owner TEXT NOT NULL, name TEXT NOT NULL, bytes INTEGER NOT NULL, config TEXT NOT NULL,
      job_id TEXT, step INTEGER NOT NULL, created_at INTEGER NOT NULL
    );
    CREATE INDEX IF NOT EXISTS models_owner ON models (owner, created_at)`,
    addModelColumn,
    `CREATE TABLE IF NOT EXISTS model_names (name TEXT PRIMARY KEY, owner TEXT NOT NULL, claimed_at INTEGER NOT NULL);
    INSERT INTO model_names (name, owner, claimed_at)
      SELECT m.name, m.owner, m.created_at FROM models m
      WHERE NOT EXISTS (SELECT 1 FROM models o WHERE o.name = m.name AND (o.created_at < m.created_at OR (o.created_at = m.created_at AND o.sha256 < m.sha256)))`,
    `ALTER TABLE models ADD COLUMN kept_until INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE models ADD COLUMN published_at INTEGER`,
  ],
};

/** Step 2: the `model` column (the model's reference), derived for the existing rows (all GPTs) from their config. */
function addModelColumn(db: StateDb): void {
  db.exec("ALTER TABLE models ADD COLUMN model TEXT NOT NULL DEFAULT ''");
  const rows = db.statement('SELECT sha256, config FROM models').all() as { sha256: string; config: string }[];
  const update = db.statement('UPDATE models SET model = ? WHERE sha256 = ?');
  for (const r of rows) {
    // a config that does not decode keeps '': reading the row then reports it as corrupt, as before
    const ref = gptRefOf(r.config);
    if (ref) update.run(ref, r.sha256);
  }
}

/** The reference of a stored GPT config, or null when it is not one. */
function gptRefOf(text: string): string | null {
  try {
    const config: unknown = JSON.parse(text);
    return Value.Check(GptConfig, config) ? wholeModelRef({ kind: 'gpt', config }) : null;
  } catch {
    return null;
  }
}

const Int = Type.Integer({ minimum: 0 });
const ModelRow = Type.Object({
  sha256: Type.String({ pattern: '^[0-9a-f]{64}$' }),
  owner: Type.String(),
  name: Type.String(),
  bytes: Int,
  model: Type.String(),
  config: Type.String(),
  jobId: Type.Union([Type.String(), Type.Null()]),
  step: Int,
  createdAt: Int,
  keptUntil: Int,
  publishedAt: Type.Union([Int, Type.Null()]),
});
type Row = Static<typeof ModelRow>;
/** A stored model: its kind, its reference (`model`) and the config of its kind, besides the row's other fields. */
export type ModelRecord = Omit<Row, 'model' | 'config'> & WholeModelConfig & { model: string };
const COLUMNS = 'sha256, owner, name, bytes, model, config, job_id AS jobId, step, created_at AS createdAt, kept_until AS keptUntil, published_at AS publishedAt';
const readRow = rowReader(ModelRow, 'model');
function decode(row: unknown): ModelRecord {
  const r = readRow(row);
  const what = `model ${r.sha256}`;
  let kind: 'gpt' | 'mlp';
  try {
    kind = parseModelRef(r.model).kind;
  } catch (err) {
    throw new NimbleError('corrupt', `stored ${what} has no valid model reference: ${(err as Error).message}`);
  }
  const m: WholeModelConfig = kind === 'gpt' ? { kind, config: jsonColumn(GptConfig, r.config, `config of ${what}`) } : { kind, config: jsonColumn(MlpConfig, r.config, `config of ${what}`) };
  if (wholeModelRef(m) !== r.model) throw new NimbleError('corrupt', `stored ${what}: its config is not of its model ${r.model}`);
  return { ...r, ...m };
}

/** What storing a model records. */
export type NewModel = Omit<Row, 'model' | 'config' | 'createdAt' | 'keptUntil' | 'publishedAt'> & WholeModelConfig & { model: string } & { keptUntil?: number };

export class ModelStore {
  constructor(private readonly db: StateDb) {}

  /**
   * Records `m` unless its sha256 is stored already. Returns the row as it is
   * now, and whether it is new: `m`'s, or (the same owner storing it again)
   * the first row with the new name, or another owner's row, left untouched:
   * the caller refuses it.
   */
  claim(m: NewModel, now: number): { record: ModelRecord; created: boolean } {
    return this.db.tx(() => {
      const held = this.get(m.sha256);
      if (held && held.owner.toLowerCase() !== m.owner.toLowerCase()) return { record: held, created: false };
      this.claimName(m.name, m.owner, now);
      if (held) this.db.run('UPDATE models SET name = ? WHERE sha256 = ?', m.name, m.sha256);
      else {
        this.db.run(
          'INSERT INTO models (sha256, owner, name, bytes, model, config, job_id, step, created_at, kept_until) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)',
          m.sha256,
          m.owner,
          m.name,
          m.bytes,
          m.model,
          JSON.stringify(m.config),
          m.jobId,
          m.step,
          now,
          m.keptUntil ?? 0,
        );
      }
      return { record: this.get(m.sha256)!, created: !held };
    });
  }

  /**
   * Makes `name` `owner`'s unless it is someone else's: 409 `name_taken` then
   * (names are compared as they are spelt, as the registry compares them).
   */
  claimName(name: string, owner: string, now: number): void {
    const holder = this.nameOwner(name);
    if (holder && holder.toLowerCase() !== owner.toLowerCase()) {
      throw new NimbleError('name_taken', `the model name '${name}' is ${holder}'s (the first to store a model under a name owns it): choose another name`, 409);
    }
    if (!holder) this.db.run('INSERT INTO model_names (name, owner, claimed_at) VALUES (?, ?, ?)', name, owner, now);
  }

  /** Who owns a model name (null: nobody yet). */
  nameOwner(name: string): string | null {
    const r = this.db.statement('SELECT owner FROM model_names WHERE name = ?').get(name) as { owner: string } | undefined;
    return r?.owner ?? null;
  }

  /** Drops a row whose bytes could not be stored. */
  forget(sha256: string): void {
    this.db.run('DELETE FROM models WHERE sha256 = ?', sha256);
  }

  get(sha256: string): ModelRecord | undefined {
    return one(this.db, decode, `SELECT ${COLUMNS} FROM models WHERE sha256 = ?`, sha256);
  }

  /** Every stored model, newest first (of one owner when given). */
  list(owner?: string): ModelRecord[] {
    return owner
      ? all(this.db, decode, `SELECT ${COLUMNS} FROM models WHERE LOWER(owner) = LOWER(?) ORDER BY created_at DESC, sha256`, owner)
      : all(this.db, decode, `SELECT ${COLUMNS} FROM models ORDER BY created_at DESC, sha256`);
  }

  /** Paid for until `until` (a later time only: a keep never shortens). */
  keep(sha256: string, until: number): void {
    this.db.run('UPDATE models SET kept_until = ? WHERE sha256 = ? AND kept_until < ?', until, sha256, until);
  }

  /** Seen published on the registry at `at`: never collected from then on. */
  markPublished(sha256: string, at: number): void {
    this.db.run('UPDATE models SET published_at = ? WHERE sha256 = ? AND published_at IS NULL', at, sha256);
  }

  /** Unpublished models whose free retention (created before `createdBefore`) and paid time (before `now`) have passed, oldest first. */
  expired(createdBefore: number, now: number, limit: number): ModelRecord[] {
    return all(this.db, decode, `SELECT ${COLUMNS} FROM models WHERE published_at IS NULL AND created_at < ? AND kept_until < ? ORDER BY created_at, sha256 LIMIT ?`, createdBefore, now, limit);
  }

  /** Bytes of every stored model. */
  totalBytes(): number {
    return scalar(this.db, 'SELECT COALESCE(SUM(bytes), 0) AS n FROM models');
  }

  /** Bytes of the models kept for free now: not published, not paid for at `now`. */
  freeBytes(now: number): number {
    return scalar(this.db, 'SELECT COALESCE(SUM(bytes), 0) AS n FROM models WHERE published_at IS NULL AND kept_until <= ?', now);
  }

  countOf(owner: string): number {
    return scalar(this.db, 'SELECT COUNT(*) AS n FROM models WHERE LOWER(owner) = LOWER(?)', owner);
  }

  /** Whether a stored model is this blob (then the collector never deletes it). */
  referencesBlob(blob: string): boolean {
    return scalar(this.db, 'SELECT COUNT(*) AS n FROM models WHERE sha256 = ?', blob) > 0;
  }
}
