// The model store's rows (src/orchestrator/state/models.ts) without a server:
// a GPT and an MLP classifier are recorded with their kind, reference and
// config; a file written before the `model` column migrates, its GPT rows
// readable with the reference derived from their config; a row whose
// reference and config disagree is corrupt state, not a cast.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { gptConfig } from '../../../src/model/config.ts';
import { OrchestratorState } from '../../../src/orchestrator/state/index.ts';
import { StateDb } from '../../../src/orchestrator/state/db.ts';
import { MODEL_MIGRATIONS } from '../../../src/orchestrator/state/models.ts';
import { NimbleError } from '../../../src/protocol/errors.ts';

const dir = mkdtempSync(join(tmpdir(), 'nimble-model-store-'));
after(() => rmSync(dir, { recursive: true, force: true }));
const OWNER = '0x00000000000000000000000000000000000000d1';
const sha = (c: string): string => c.repeat(64);
const isCorrupt = (err: unknown): boolean => err instanceof NimbleError && err.code === 'corrupt' && err.status === 500;

test('a GPT and an MLP classifier are stored with their kind, reference and config', () => {
  const state = OrchestratorState.open(join(dir, 'new.sqlite'));
  const base = { owner: OWNER, bytes: 100, jobId: null, step: 3 };
  state.models.claim({ ...base, sha256: sha('a'), name: 'micro', kind: 'gpt', model: 'gpt-micro', config: gptConfig('gpt-micro') }, 1);
  state.models.claim({ ...base, sha256: sha('b'), name: 'spam-mlp', kind: 'mlp', model: 'mlp:4096-64-2', config: { inputs: 4096, hidden: [64], classes: 2 } }, 2);
  const mlp = state.models.get(sha('b'))!;
  assert.deepEqual(mlp, { ...base, sha256: sha('b'), name: 'spam-mlp', kind: 'mlp', model: 'mlp:4096-64-2', config: { inputs: 4096, hidden: [64], classes: 2 }, createdAt: 2, keptUntil: 0, publishedAt: null });
  const gpt = state.models.get(sha('a'))!;
  assert.equal(gpt.kind, 'gpt');
  assert.equal(gpt.model, 'gpt-micro');
  assert.deepEqual(gpt.config, gptConfig('gpt-micro'));
  assert.deepEqual(state.models.list(OWNER).map((m) => [m.name, m.kind]), [['spam-mlp', 'mlp'], ['micro', 'gpt']]);

  // a reference that disagrees with its config, or none at all, is corrupt state
  state.db.run('UPDATE models SET model = ? WHERE sha256 = ?', 'mlp:4096-32-2', sha('b'));
  assert.throws(() => state.models.get(sha('b')), (e: unknown) => isCorrupt(e) && /config is not of its model mlp:4096-32-2/.test((e as Error).message));
  state.db.run('UPDATE models SET model = ? WHERE sha256 = ?', 'gpt-micro', sha('b'));
  assert.throws(() => state.models.get(sha('b')), (e: unknown) => isCorrupt(e) && /config of model/.test((e as Error).message));
  state.db.run("UPDATE models SET model = '' WHERE sha256 = ?", sha('b'));
  assert.throws(() => state.models.get(sha('b')), (e: unknown) => isCorrupt(e) && /no valid model reference/.test((e as Error).message));
  state.close();
});

test('a file from before the model column migrates: its GPT rows stay readable, named by the reference of their config', () => {
  const path = join(dir, 'old.sqlite');
  // the model store at its first version, with rows as that version wrote them
  const old = new StateDb(path, [{ store: 'models', steps: MODEL_MIGRATIONS.steps.slice(0, 1) }]);
  const insert = 'INSERT INTO models (sha256, owner, name, bytes, config, job_id, step, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)';
  old.run(insert, sha('c'), OWNER, 'named', 30_000, JSON.stringify(gptConfig('gpt-micro')), 'job-00000000000000a1', 20, 5);
  const inline = { vocabSize: 256, contextLength: 32, channels: 32, layers: 2, heads: 4, mlpRatio: 4, init: 'gpt2' };
  old.run(insert, sha('d'), OWNER, 'inline', 40_000, JSON.stringify(inline), null, 40, 6);
  assert.equal(old.versions().models, 1);
  old.close();

  const state = OrchestratorState.open(path);
  assert.equal(state.db.versions().models, MODEL_MIGRATIONS.steps.length);
  const named = state.models.get(sha('c'))!;
  assert.deepEqual(named, { sha256: sha('c'), owner: OWNER, name: 'named', bytes: 30_000, kind: 'gpt', model: 'gpt-micro', config: gptConfig('gpt-micro'), jobId: 'job-00000000000000a1', step: 20, createdAt: 5, keptUntil: 0, publishedAt: null });
  // each existing name is its first owner's
  assert.equal(state.models.nameOwner('named'), OWNER);
  const inlineRow = state.models.get(sha('d'))!;
  assert.equal(inlineRow.kind, 'gpt');
  assert.equal(inlineRow.model, 'gpt:v256.t32.c32.l2.h4.r4');
  assert.deepEqual(inlineRow.config, inline);
  assert.equal(state.models.list().length, 2);
  // and the migrated store takes new rows of either kind
  state.models.claim({ sha256: sha('e'), owner: OWNER, name: 'spam', bytes: 9, kind: 'mlp', model: 'mlp:64-16-2', config: { inputs: 64, hidden: [16], classes: 2 }, jobId: null, step: 0 }, 7);
  assert.equal(state.models.get(sha('e'))!.kind, 'mlp');
  state.close();
});
