// Runs every *.test.ts under test/ with node's test runner (through tsx).
// Usage: node scripts/run-tests.mjs [substring filter ...]
import { spawnSync } from 'node:child_process';
import { readdirSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';

const root = new URL('..', import.meta.url).pathname;
function walk(dir) {
  return readdirSync(dir).flatMap((name) => {
    const p = join(dir, name);
    return statSync(p).isDirectory() ? walk(p) : p.endsWith('.test.ts') ? [p] : [];
  });
}
const filters = process.argv.slice(2);
const files = walk(join(root, 'test'))
  .map((p) => relative(root, p))
  .filter((p) => filters.length === 0 || filters.some((f) => p.includes(f)))
  .sort();
if (files.length === 0) {
  console.error('run-tests: no test files matched');
  process.exit(1);
}
const concurrency = process.env.NIMBLE_TEST_CONCURRENCY ?? '1';
const r = spawnSync(process.execPath, ['--import', 'tsx', '--test', `--test-concurrency=${concurrency}`, '--test-reporter=spec', ...files], {
  cwd: root,
  stdio: 'inherit',
});
process.exit(r.status ?? 1);
