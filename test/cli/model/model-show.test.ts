// What `nbcli model show` says of a stored model's file: its size, source,
// kind and sizes, for a GPT and for an MLP classifier.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { StoredModelView } from '../../../src/api/models.ts';
import { storedLine } from '../../../src/cli/model/model.ts';
import { gptConfig } from '../../../src/model/config.ts';

const base = { sha256: 'a'.repeat(64), owner: '0x00000000000000000000000000000000000000d1', name: 'm', bytes: 4321, createdAt: 1 };
const URL = 'http://127.0.0.1:7000';

test('model show names the kind, the reference and the sizes of a GPT and of a classifier', () => {
  const gpt: StoredModelView = { ...base, kind: 'gpt', model: 'gpt-micro', config: gptConfig('gpt-micro'), jobId: 'job-00000000000000a1', step: 20 };
  assert.equal(storedLine(gpt, URL), `  stored at ${URL}: 4321 bytes, job job-00000000000000a1 step 20, gpt gpt-micro: 2 layers × 16 channels, context 16, vocab 256`);
  const mlp: StoredModelView = { ...base, kind: 'mlp', model: 'mlp:4096-64-2', config: { inputs: 4096, hidden: [64], classes: 2 }, jobId: null, step: 150 };
  assert.equal(storedLine(mlp, URL), `  stored at ${URL}: 4321 bytes, uploaded (step 150), mlp classifier mlp:4096-64-2: 4096 inputs, hidden 64, 2 classes`);
  const flat: StoredModelView = { ...mlp, model: 'mlp:16-3', config: { inputs: 16, hidden: [], classes: 3 } };
  assert.match(storedLine(flat, URL), /mlp classifier mlp:16-3: 16 inputs, no hidden layer, 3 classes$/);
  assert.equal(storedLine(null, URL), `  the orchestrator at ${URL} does not store its file`);
});
