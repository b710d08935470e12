// src/chain/abis.ts is generated from the compiled contracts: it must be what
// the artifacts in build/contracts/ give, or a contract changed without a
// rebuild (`npm run build:contracts`) and the typed ABIs lie.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { ABIS_MODULE, renderAbisModule } from '../../scripts/abis-module.mjs';
import { ARTIFACTS_DIR, ContractArtifact } from '../../src/chain/contracts.ts';
import { readJsonFile } from '../../src/chain/schemas.ts';

const root = fileURLToPath(new URL('../..', import.meta.url));

test('src/chain/abis.ts is what build/contracts/ gives (run `npm run build:contracts` after changing a contract)', () => {
  const artifacts = readdirSync(ARTIFACTS_DIR)
    .filter((f) => f.endsWith('.json'))
    .map((f) => readJsonFile(ContractArtifact, join(ARTIFACTS_DIR, f), 'contract artifact'));
  assert.ok(artifacts.length > 0, `no artifacts in ${ARTIFACTS_DIR}: run \`npm run build:contracts\``);
  const expected = renderAbisModule(artifacts);
  const actual = readFileSync(join(root, ABIS_MODULE), 'utf8');
  assert.ok(actual === expected, `${ABIS_MODULE} is stale or edited by hand: run \`npm run build:contracts\` and commit it`);
});
