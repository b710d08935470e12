// The data dir's local chain node and who stops it: a real orchestrator
// process on its anvil says on stop that it saved and stopped its node (or,
// when another live process keeps the node, that it keeps running and how to
// stop it). One killed with SIGKILL leaves its anvil running: `nbcli chain
// status` shows it, `nbcli chain stop` saves its state and stops it by the
// pid node.json records. A pid that is not an anvil process is refused (the
// process lives on), and so is a node an orchestrator still keeps.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { isAlive } from '../../../src/chain/anvil.ts';
import { localNodePaths, type LocalNodeFile } from '../../../src/chain/node.ts';
import { openChain } from '../../../src/chain/session.ts';
import { Cluster } from '../../network/helpers.ts';

const cluster = new Cluster();
const home = join(cluster.dir, 'orch');
const paths = localNodePaths(home);
const strays: number[] = [];
after(async () => {
  for (const pid of strays) if (isAlive(pid)) process.kill(pid, 'SIGKILL');
  await cluster.stopGracefully();
});

const nbcli = (...args: string[]) => cluster.nbcli([...args, '--data-dir', home], home);
/** Everything the last orchestrator stopped printed, for a failed assertion's message. */
let lastLines: string[] = [];
const nodeFile = (): LocalNodeFile => JSON.parse(readFileSync(paths.node, 'utf8')) as LocalNodeFile;

/** Stops the orchestrator with `signal`; the messages it logged. */
async function stopOrchestrator(signal: NodeJS.Signals): Promise<string[]> {
  const p = cluster.orchestrator!;
  // 'close', not 'exit': the last lines it wrote may still be in the pipe when it exits
  const closed = new Promise((r) => p.child.once('close', r));
  p.child.kill(signal);
  await closed;
  lastLines = p.lines;
  return p.lines.flatMap((l) => {
    try {
      return [String(JSON.parse(l).message)];
    } catch {
      return [];
    }
  });
}

test('an orchestrator stops its node and says so; chain stop refuses a node an orchestrator keeps', { timeout: 60_000 }, async () => {
  process.env.NIMBLE_CHAIN_RPC = '';
  await cluster.startOrchestrator(['--min-stake', '0'], { chain: true });
  const { pid, ownerPid } = nodeFile();
  const status = await nbcli('chain', 'status');
  assert.equal(status.code, 0, status.stderr);
  assert.deepEqual([status.out[0].running, status.out[0].pid, status.out[0].ownerAlive, status.out[0].anvil, status.out[0].answering], [true, pid, true, true, true]);
  const kept = await nbcli('chain', 'stop');
  assert.equal(kept.code, 1);
  assert.match(kept.stderr, new RegExp(`the local chain node \\(anvil pid ${pid}, http://127\\.0\\.0\\.1:\\d+\\) is kept by process ${ownerPid}, which still runs .*: stop that process, and it saves and stops its node`));
  assert.ok(isAlive(pid), 'the node runs on');

  const said = await stopOrchestrator('SIGTERM');
  assert.ok(said.some((m) => m.startsWith(`stopped the local chain node (anvil pid ${pid}, http://127.0.0.1:`) && m.endsWith(`its state is saved in ${paths.state}`)), lastLines.join('\n'));
  assert.ok(!isAlive(pid), 'and it is stopped');
});

test('a node another live process keeps runs on when the orchestrator stops, and it says so', { timeout: 60_000 }, async () => {
  const keeper = await openChain({ dataDir: home, persistent: true }); // this process keeps the node
  try {
    await cluster.startOrchestrator(['--min-stake', '0'], { chain: true });
    const said = await stopOrchestrator('SIGTERM');
    const line = `the local chain node (anvil pid ${keeper.node!.pid}, ${keeper.node!.rpcUrl}) keeps running for process ${process.pid}, which started it and stops it when it ends; once that process is gone, nbcli chain stop --data-dir ${home} stops it`;
    assert.ok(said.includes(line), lastLines.join('\n'));
    assert.ok(isAlive(keeper.node!.pid));
  } finally {
    await keeper.close();
  }
});

test('an orchestrator killed with SIGKILL leaves its anvil running: chain status shows it, chain stop saves and stops it; a pid that is not an anvil is refused', { timeout: 60_000 }, async () => {
  await cluster.startOrchestrator(['--min-stake', '0'], { chain: true });
  await stopOrchestrator('SIGKILL');
  const left = nodeFile();
  assert.ok(isAlive(left.pid), 'the anvil outlives its orchestrator');
  strays.push(left.pid);
  const status = await nbcli('chain', 'status');
  assert.deepEqual([status.out[0].running, status.out[0].pid, status.out[0].ownerAlive], [true, left.pid, false]);
  writeFileSync(paths.state, 'not the state'); // whatever is there is replaced by the node's state
  const stopped = await nbcli('chain', 'stop');
  assert.equal(stopped.code, 0, stopped.stderr);
  assert.deepEqual([stopped.out[0].event, stopped.out[0].pid, stopped.out[0].saved], ['stopped', left.pid, true]);
  assert.ok(!isAlive(left.pid), 'stopped');
  assert.ok(!existsSync(paths.node), 'node.json is gone');
  assert.notEqual(readFileSync(paths.state, 'utf8'), 'not the state', 'the state was saved first');
  const again = await nbcli('chain', 'stop');
  assert.equal(again.code, 0, again.stderr);
  assert.equal(again.out[0].event, 'not-running');

  // node.json naming a pid that is another program's (a reused pid): refused, the process lives on
  const other = spawn('sleep', ['60'], { stdio: 'ignore' });
  strays.push(other.pid!);
  writeFileSync(paths.node, JSON.stringify({ ...left, pid: other.pid }));
  const refused = await nbcli('chain', 'stop');
  assert.equal(refused.code, 1);
  assert.match(refused.stderr, new RegExp(`process ${other.pid} that ${paths.node} names is not an anvil node \\(it runs 'sleep 60'\\): not stopped`));
  assert.ok(isAlive(other.pid!), 'the other process was not touched');
});
