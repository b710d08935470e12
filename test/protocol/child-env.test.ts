// Child processes see an allowlist of the parent's environment
// (src/protocol/child-env.ts): a secret-looking variable of the parent never
// reaches them, what they need by name does. Checked in a real child's
// environment, and in the local chain node's (/proc/<pid>/environ on Linux).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { startAnvil } from '../../src/chain/anvil.ts';
import { minerChildEnv } from '../../src/cli/up/up.ts';
import { childEnv } from '../../src/protocol/child-env.ts';
import { tempDir } from '../chain/helpers.ts';

const SECRETS = { AWS_SECRET_ACCESS_KEY: 'aws-secret', NIMBLE_FAKE_SECRET: 'fake-secret', NIMBLE_PASSWORD: 'wallet-password', NIMBLE_WALLET_SECRET: '0xkey', GITHUB_TOKEN: 'ghp_x' };

/** Runs `fn` with SECRETS in this process's environment, then removes them. */
async function withSecrets<T>(fn: () => T | Promise<T>): Promise<T> {
  Object.assign(process.env, SECRETS);
  try {
    return await fn();
  } finally {
    for (const k of Object.keys(SECRETS)) delete process.env[k];
  }
}

/** The environment a node child started with `env` sees. */
function envOfChild(env: NodeJS.ProcessEnv): Record<string, string> {
  const r = spawnSync(process.execPath, ['-e', 'process.stdout.write(JSON.stringify(process.env))'], { env, encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout) as Record<string, string>;
}

test("a child started with childEnv() sees PATH and HOME but none of the parent's secrets; what it needs is passed by name", async () => {
  const seen = await withSecrets(() => envOfChild(childEnv({ NIMBLE_HOME: '/tmp/x', EXTRA: 'yes' })));
  for (const k of Object.keys(SECRETS)) assert.equal(seen[k], undefined, `${k} does not reach the child`);
  assert.equal(seen.PATH, process.env.PATH);
  assert.equal(seen.HOME, process.env.HOME);
  assert.deepEqual([seen.NIMBLE_HOME, seen.EXTRA], ['/tmp/x', 'yes']);
  // with the parent's environment copied, as before, they do
  const leaky = await withSecrets(() => envOfChild({ ...process.env }));
  assert.equal(leaky.NIMBLE_FAKE_SECRET, 'fake-secret', 'the test can tell');
  assert.equal(childEnv({ PATH: undefined }, { PATH: '/bin', HOME: '/h' }).PATH, undefined, 'an extra of undefined removes a variable');
});

test("nbcli up's miners get their data folder, and the wallet password only when they unlock a wallet", async () => {
  await withSecrets(() => {
    const paid = minerChildEnv('/data/miners/miner-1', 'demo-password');
    const unpaid = minerChildEnv('/data/miners/miner-1', null);
    assert.deepEqual([paid.NIMBLE_HOME, paid.NIMBLE_PASSWORD], ['/data/miners/miner-1', 'demo-password']);
    assert.equal(unpaid.NIMBLE_PASSWORD, undefined, "the parent's password is not passed on");
    for (const env of [paid, unpaid]) {
      for (const k of ['AWS_SECRET_ACCESS_KEY', 'NIMBLE_FAKE_SECRET', 'NIMBLE_WALLET_SECRET', 'GITHUB_TOKEN']) assert.equal(env[k], undefined, k);
    }
  });
});

test("the local chain node's process environment holds none of the parent's secrets", { skip: process.platform !== 'linux' && 'reads /proc/<pid>/environ' }, async (t) => {
  const dir = tempDir('anvil-env');
  const anvil = await withSecrets(() => startAnvil({ logFile: join(dir, 'anvil.log') }));
  t.after(async () => {
    await anvil.stop();
    rmSync(dir, { recursive: true, force: true });
  });
  const environ = readFileSync(`/proc/${anvil.pid}/environ`, 'utf8').split('\0').filter(Boolean);
  const names = environ.map((kv) => kv.slice(0, kv.indexOf('=')));
  for (const k of Object.keys(SECRETS)) assert.ok(!names.includes(k), `${k} is not in anvil's environment`);
  assert.ok(names.includes('PATH'));
});
