// nbcli orchestrator start's cluster flags (src/cli/node/orchestrator.ts):
// --lease-ttl and --advertise are for orchestrators sharing a PostgreSQL
// state, and are checked before anything starts; each refusal is one line.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { Command } from 'commander';
import { registerOrchestrator } from '../../../src/cli/node/orchestrator.ts';
import { NimbleError } from '../../../src/protocol/errors.ts';

const dir = mkdtempSync(join(tmpdir(), 'nimble-orch-flags-'));
after(() => rmSync(dir, { recursive: true, force: true }));

/** Runs `nbcli orchestrator start ...args` in this process; resolves with the error it stops with. */
async function startError(args: string[]): Promise<unknown> {
  const program = new Command('nbcli').exitOverride();
  registerOrchestrator(program);
  program.commands.forEach((c) => c.exitOverride().commands.forEach((s) => s.exitOverride()));
  try {
    await program.parseAsync(['orchestrator', 'start', '--no-chain', '--data-dir', dir, ...args], { from: 'user' });
  } catch (err) {
    return err;
  }
  assert.fail('the command did not stop');
}

test('--lease-ttl and --advertise: only with a PostgreSQL state, in range, an http(s) origin; one line each', async () => {
  const pg = ['--db', 'postgres://nimble@127.0.0.1:1/nimble'];
  const cases: [string[], RegExp][] = [
    [['--lease-ttl', '5s'], /^--lease-ttl is for orchestrators sharing a PostgreSQL state/],
    [['--advertise', 'http://a:7070'], /^--advertise is for orchestrators sharing a PostgreSQL state/],
    [[...pg, '--lease-ttl', '100ms'], /^--lease-ttl must be from 500ms to 10m, got '100ms'/],
    [[...pg, '--lease-ttl', '11m'], /^--lease-ttl must be from 500ms to 10m/],
    [[...pg, '--lease-ttl', 'soon'], /^--lease-ttl: /],
    [[...pg, '--advertise', 'ftp://a:21'], /^--advertise must be an http\(s\) URL with no path/],
    [[...pg, '--advertise', 'http://a:7070/api'], /^--advertise must be an http\(s\) URL with no path/],
    [[...pg, '--advertise', 'http://user:pw@a:7070'], /^--advertise must be an http\(s\) URL with no path/],
    [[...pg, '--advertise', 'not a url'], /^--advertise must be an http\(s\) URL, got 'not a url'/],
  ];
  for (const [args, message] of cases) {
    const err = await startError(args);
    assert.ok(err instanceof NimbleError && err.code === 'invalid', `${args.join(' ')}: ${String(err)}`);
    assert.match(err.message, message);
    assert.doesNotMatch(err.message, /\n/);
  }
});
