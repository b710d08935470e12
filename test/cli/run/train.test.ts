// nbcli train --local end to end in a child process: progress, held-out loss,
// checkpoint, sample; and user errors with a one-line message and exit code 1.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { readCheckpoint } from '../../../src/model/checkpoint.ts';
import { nbcliArgv } from '../../helpers/nbcli.ts';

/** nbcli as a child process (the build when fresh: test/helpers/nbcli.ts) */
const [node, ...pre] = nbcliArgv();

const root = new URL('../../..', import.meta.url).pathname;
let dir: string;
before(() => {
  dir = mkdtempSync(join(tmpdir(), 'nimble-cli-'));
});
after(() => {
  rmSync(dir, { recursive: true, force: true });
});

function nbcli(args: string[]): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync(node, [...pre, ...args], {
    cwd: root,
    encoding: 'utf8',
    env: { ...process.env, NIMBLE_HOME: dir },
    timeout: 120_000,
  });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

test('train --local --json trains, evaluates, writes a checkpoint and samples', () => {
  const out = join(dir, 'm.safetensors');
  const r = nbcli(['train', '--local', '--model', 'gpt-micro', '--steps', '60', '--batch', '4', '--eval-batches', '5', '--sample-length', '20', '--threads', '2', '--out', out, '--json']);
  assert.equal(r.status, 0, r.stderr);
  const lines = r.stdout.trim().split('\n').map((l) => JSON.parse(l));
  const steps = lines.filter((l) => l.event === 'step');
  assert.ok(steps.length >= 1);
  const done = lines.find((l) => l.event === 'done');
  assert.ok(done, 'a final summary line');
  assert.ok(done.heldoutLoss > 0 && done.heldoutLoss < Math.log(256), `held-out loss ${done.heldoutLoss}`);
  assert.ok(done.finalLoss < 5, `final loss ${done.finalLoss}`);
  assert.equal(done.checkpoint, out);
  assert.equal(readCheckpoint(out).info.step, 60);
  assert.ok(done.sample.startsWith('Call me Ishmael. '));
});

test('the human view shows progress and defaults the checkpoint into the data dir', () => {
  const r = nbcli(['train', '--local', '--model', 'gpt-micro', '--steps', '3', '--batch', '2', '--eval-batches', '2', '--sample-length', '5']);
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stderr, /train \[=+\] 3\/3 loss \d+\.\d+ [\d,]+ tok\/s/);
  assert.match(r.stdout, /held-out loss \d+\.\d+ nats\/byte/);
  const path = /checkpoint: (.*)/.exec(r.stdout)![1];
  assert.ok(path.startsWith(join(dir, 'checkpoints')) && existsSync(path));
});

test('user errors: one line on stderr, exit code 1', () => {
  for (const [args, pattern] of [
    [['train', '--local', '--steps', 'ten'], /--steps must be a positive integer/],
    [['train', '--local', '--model', 'gpt-huge'], /unknown model 'gpt-huge'/],
    [['train', '--local', '--data', '/no/such/file'], /unknown data set/],
    [['train', '--steps', '5', '--orchestrator', 'http://127.0.0.1:1'], /cannot reach the orchestrator at http:\/\/127.0.0.1:1/],
  ] as const) {
    const r = nbcli([...args]);
    assert.equal(r.status, 1, `${args.join(' ')}: ${r.stderr}`);
    assert.match(r.stderr, pattern);
    assert.equal(r.stderr.trim().split('\n').length, 1, r.stderr);
  }
});
