// The job spec: every problem named by its field with what was expected;
// defaults filled in; durations read as people write them; the templates valid.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { formatDuration, parseDuration } from '../../src/jobs/duration.ts';
import { jobSpecProblems, JobSpecError, parseJobSpec, resolveJobSpec, validateJobSpec } from '../../src/jobs/spec.ts';
import { canMove } from '../../src/jobs/status.ts';
import { JOB_TEMPLATES } from '../../src/jobs/templates.ts';

const ok = { name: 'a', model: 'gpt-tiny', data: 'moby-dick', training: { steps: 10 } };

test('a valid spec has no problems and resolves with its defaults', () => {
  assert.deepEqual(jobSpecProblems(ok), []);
  const r = resolveJobSpec(validateJobSpec(ok));
  assert.equal(r.steps, 10);
  assert.equal(r.batchSize, 12);
  assert.equal(r.timeoutMs, 24 * 3_600_000);
  assert.equal(r.idleTimeoutMs, 10 * 60_000);
  assert.equal(r.checkpointEvery, 10);
  assert.equal(r.budgetWei, null);
  assert.equal(resolveJobSpec(validateJobSpec({ ...ok, training: { tokens: 7681 }, budget: '2.5' })).steps, 11, 'tokens / (batch × context), rounded up');
  assert.equal(resolveJobSpec(validateJobSpec({ ...ok, budget: '2.5' })).budgetWei, 2_500_000_000_000_000_000n);
});

test('every problem of a bad spec is reported at once, each with its field and what was expected', () => {
  const problems = jobSpecProblems({ name: 'a b', model: 'gpt-huge', data: 'moby-dick', training: { steps: -1, lr: 3 }, limits: { timeout: '5x' }, budget: 12 });
  const byPath = Object.fromEntries(problems.map((p) => [p.path, p.message]));
  assert.deepEqual(Object.keys(byPath).sort(), ['/budget', '/limits/timeout', '/model', '/name', '/training/lr', '/training/steps']);
  assert.match(byPath['/model'], /gpt-tiny/);
  assert.match(byPath['/training/steps'], /integer from 1 .* got -1/);
  assert.equal(byPath['/training/lr'], 'unknown field');
  assert.match(byPath['/limits/timeout'], /duration such as/);
  assert.match(byPath['/budget'], /amount of NIM/);
});

test('fields that depend on each other: heads divide channels, data fits the model, steps or tokens', () => {
  const paths = (v: unknown): string[] => jobSpecProblems(v).map((p) => p.path);
  assert.deepEqual(paths({ ...ok, model: { type: 'gpt', vocabSize: 256, contextLength: 64, channels: 130, layers: 2, heads: 4 } }), ['/model/heads']);
  assert.deepEqual(paths({ ...ok, data: 'spam-assassin' }), ['/data']);
  assert.deepEqual(paths({ ...ok, model: { type: 'mlp', inputs: 4096, hidden: [8], classes: 2 } }), ['/data']);
  assert.deepEqual(paths({ ...ok, model: { type: 'mlp', inputs: 4096, hidden: [8], classes: 3 }, data: 'spam-assassin' }), ['/model/classes']);
  assert.deepEqual(paths({ ...ok, training: {} }), ['/training']);
  assert.deepEqual(paths({ ...ok, training: { steps: 1, tokens: 1 } }), ['/training']);
  assert.deepEqual(paths({ ...ok, model: { type: 'cnn' } }), ['/model/type']);
  assert.deepEqual(paths({ ...ok, limits: { idleTimeout: '10ms' } }), ['/limits/idleTimeout']);
  // a paid job's escrow stays locked while it runs: its timeout is bounded
  assert.deepEqual(paths({ ...ok, limits: { timeout: '7d' } }), []);
  assert.deepEqual(paths({ ...ok, limits: { timeout: '7.5d' } }), ['/limits/timeout']);
  assert.match(jobSpecProblems({ ...ok, limits: { timeout: '30d' } })[0].message, /at most 7d .*got "30d"/);
  assert.deepEqual(paths([]), ['']);
});

test('a spec file that is not JSON, or not valid, throws a JobSpecError naming the file', () => {
  assert.throws(() => parseJobSpec('{', 'x.json'), (e: unknown) => e instanceof JobSpecError && /x\.json is not valid/.test(e.message) && /not JSON/.test(e.message));
  assert.throws(() => parseJobSpec('{"name":"a"}', 'y.json'), (e: unknown) => e instanceof JobSpecError && e.problems.length >= 3);
});

test('the templates are valid specs', () => {
  for (const t of Object.values(JOB_TEMPLATES)) assert.deepEqual(jobSpecProblems(t), [], t.name);
});

test('durations', () => {
  assert.equal(parseDuration('90s'), 90_000);
  assert.equal(parseDuration('1.5h'), 5_400_000);
  assert.equal(parseDuration('3d'), 259_200_000);
  assert.throws(() => parseDuration('3 days'));
  assert.equal(formatDuration(90_000), '1.5m');
  assert.equal(formatDuration(259_200_000), '3d');
});

test('statuses move forward (or back to waiting), never out of a final one', () => {
  assert.ok(canMove('waiting', 'started'));
  assert.ok(canMove('executing', 'waiting'));
  assert.ok(canMove('started', 'timed_out'));
  assert.ok(!canMove('executing', 'started'));
  assert.ok(!canMove('completed', 'waiting'));
  assert.ok(!canMove('cancelled', 'completed'));
});
