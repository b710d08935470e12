// ./nbcli, the command line of a clone (README, "Install"): it runs the build
// in dist/ from any folder, through a link on the PATH too, and says what to
// run when there is no build yet.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const LAUNCHER = join(ROOT, 'nbcli');
const VERSION = '0.1.0';

test('./nbcli runs the build from another folder, and through a link on the PATH', { skip: existsSync(join(ROOT, 'dist/cli/main.js')) ? false : 'no build in dist/ (npm ci makes it)' }, () => {
  const dir = mkdtempSync(join(tmpdir(), 'nimble-launcher-'));
  try {
    const direct = spawnSync(LAUNCHER, ['--version'], { cwd: dir, encoding: 'utf8', timeout: 60_000 });
    assert.equal(direct.status, 0, direct.stderr);
    assert.equal(direct.stdout.trim(), VERSION);
    symlinkSync(LAUNCHER, join(dir, 'nbcli'));
    const linked = spawnSync('nbcli', ['wallet', '--help'], { cwd: dir, encoding: 'utf8', timeout: 60_000, env: { ...process.env, PATH: `${dir}:${process.env.PATH}` } });
    assert.equal(linked.status, 0, linked.stderr);
    assert.match(linked.stdout, /Usage: nbcli wallet/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('without a build it says to run npm ci, in one line', () => {
  const dir = mkdtempSync(join(tmpdir(), 'nimble-launcher-'));
  try {
    copyFileSync(LAUNCHER, join(dir, 'nbcli'));
    // a package.json of type module beside it, as in the clone
    copyFileSync(join(ROOT, 'package.json'), join(dir, 'package.json'));
    const r = spawnSync(process.execPath, [join(dir, 'nbcli'), '--version'], { encoding: 'utf8', timeout: 60_000 });
    assert.equal(r.status, 1);
    assert.equal(r.stderr, `nbcli: not built yet: run \`npm ci\` (or \`npm run build\`) in ${dir}/\n`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
