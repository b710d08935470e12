// The network survives failures: a miner killed with SIGKILL mid-run, a
// merger killed in the middle of a merge round, and the orchestrator killed
// and restarted. Real processes on loopback.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { test } from 'node:test';
import Database from 'better-sqlite3';
import { Cluster } from './helpers.ts';

const FAST = ['--miner-timeout-ms', '1500', '--deadline-ms', '5000'];

test('a miner killed with SIGKILL mid-run: the run finishes, its microbatches are redone elsewhere', async () => {
  const cluster = new Cluster();
  try {
    await cluster.startOrchestrator(FAST);
    // throttled, so the run is surely still going when the victim dies
    const miners = await Promise.all(['a', 'b', 'c', 'd'].map((n) => cluster.startMiner(n, ['--throttle', '0.2'])));
    const run = await cluster.createRun({ model: 'gpt-micro', data: 'moby-dick', steps: 150, stages: 2, mergeEvery: 10, batchSize: 16, minMiners: 4 });
    // kill a stage-0 replica while it trains (it then holds microbatches in flight)
    const mid = await cluster.waitRun(run.id, (v) => v.microbatchesDone >= 30 && v.status === 'executing' && v.stages.every((s) => s.mode === 'training'));
    const victimName = mid.stages[0].replicas[0].name;
    const victimId = mid.stages[0].replicas[0].id;
    // kill it while the orchestrator shows it holding microbatches (not between merge rounds): it is stopped first
    // (SIGSTOP), so what it holds cannot finish between the look and the kill; if its last answer landed meanwhile
    // and it holds nothing, it goes on (SIGCONT) and the look is taken again
    const victim = miners[['a', 'b', 'c', 'd'].indexOf(victimName)].child;
    const state = new Database(join(cluster.dir, 'orch', 'orchestrator', 'orchestrator.sqlite'), { readonly: true });
    try {
      const issued = state.prepare(`SELECT COUNT(*) AS n FROM microbatches WHERE status = 'issued' AND miner_id = ?`);
      const holding = (): number => (issued.get(victimId) as { n: number }).n;
      for (let i = 0; ; i++) {
        if (i > 600) throw new Error('the victim never held a microbatch');
        if (holding() === 0) {
          await new Promise((r) => setTimeout(r, 20));
          continue;
        }
        victim.kill('SIGSTOP');
        await new Promise((r) => setTimeout(r, 300)); // what it sent before it stopped lands
        if (holding() > 0) break;
        victim.kill('SIGCONT');
      }
    } finally {
      state.close();
    }
    victim.kill('SIGKILL');
    const atKill = await cluster.run(run.id);
    assert.ok(atKill.microbatchesDone < 140, `the run was still going when the miner died (${atKill.microbatchesDone} done)`);
    const done = await cluster.waitRun(run.id, (v) => v.status === 'completed' || v.status === 'failed', 180_000);
    assert.equal(done.status, 'completed', JSON.stringify(done));
    assert.equal(done.microbatchesDone, 150);
    assert.ok(!done.stages[0].replicas.some((r) => r.id === victimId && r.alive), 'the killed miner is no longer an alive replica');
    const db = new Database(join(cluster.dir, 'orch', 'orchestrator', 'orchestrator.sqlite'), { readonly: true });
    try {
      const redone = db.prepare(`SELECT COUNT(*) AS n FROM microbatches WHERE run_id = ? AND attempts > 1 AND status = 'done'`).get(run.id) as { n: number };
      const log = db.prepare(`SELECT kind, detail FROM work_log WHERE miner_id = ? AND kind = 'dropped'`).all(victimId);
      assert.ok(redone.n >= 1, `some microbatches were issued again and finished; victim's dropped work: ${JSON.stringify(log)}`);
      const dropped = db.prepare(`SELECT SUM(units) AS n FROM work_log WHERE miner_id = ? AND kind = 'dropped'`).get(victimId) as { n: number | null };
      assert.ok((dropped.n ?? 0) >= 1, 'the dropped work is counted against the killed miner');
      const total = db.prepare(`SELECT COUNT(*) AS n FROM microbatches WHERE run_id = ? AND status = 'done'`).get(run.id) as { n: number };
      assert.equal(total.n, 150);
    } finally {
      db.close();
    }
  } finally {
    await cluster.stop();
  }
});

test('a merger killed during a merge round: every partition is still merged and the run finishes', async () => {
  const cluster = new Cluster();
  try {
    await cluster.startOrchestrator(FAST);
    // the victim waits before merging, so it is surely killed while it holds merge work
    const victim = await cluster.startMiner('victim', ['--merge-delay-ms', '60000']);
    await cluster.startMiner('b');
    await cluster.startMiner('c');
    const run = await cluster.createRun({ model: 'gpt-micro', data: 'moby-dick', steps: 30, stages: 1, mergeEvery: 5, batchSize: 8, minMiners: 3 });
    const merging = await cluster.waitRun(run.id, (v) => v.stages[0].mergePhase === 'merging');
    const round = merging.stages[0].round + 1;
    victim.child.kill('SIGKILL');
    await cluster.waitRun(run.id, (v) => v.stages[0].round >= round, 60_000);
    const db = new Database(join(cluster.dir, 'orch', 'orchestrator', 'orchestrator.sqlite'), { readonly: true });
    try {
      const r = db.prepare('SELECT * FROM merge_rounds WHERE run_id = ? AND stage = 0 AND round = ?').get(run.id, round) as { partitions: number; assignment: string; status: string };
      assert.equal(r.status, 'done');
      const merged = db.prepare('SELECT DISTINCT partition FROM merge_results WHERE run_id = ? AND stage = 0 AND round = ?').all(run.id, round) as { partition: number }[];
      assert.equal(merged.length, r.partitions, 'every partition has a merged result');
      const victimId = merging.stages[0].replicas.find((x) => x.name === 'victim')!.id;
      const byVictim = db.prepare('SELECT COUNT(*) AS n FROM merge_results WHERE miner_id = ?').get(victimId) as { n: number };
      assert.equal(byVictim.n, 0, 'the victim merged nothing: its partitions were reassigned');
    } finally {
      db.close();
    }
    const done = await cluster.waitRun(run.id, (v) => v.status === 'completed' || v.status === 'failed', 120_000);
    assert.equal(done.status, 'completed');
  } finally {
    await cluster.stop();
  }
});

test('the orchestrator killed with SIGKILL and restarted mid-run: the run resumes and finishes, and no miner is charged for the downtime', async () => {
  const cluster = new Cluster();
  try {
    await cluster.startOrchestrator(FAST);
    await Promise.all(['a', 'b', 'c'].map((n) => cluster.startMiner(n)));
    const run = await cluster.createRun({ model: 'gpt-micro', data: 'moby-dick', steps: 120, stages: 2, mergeEvery: 10, batchSize: 8, minMiners: 3 });
    const before = await cluster.waitRun(run.id, (v) => v.microbatchesDone >= 40);
    const killedAt = Date.now();
    cluster.orchestrator!.child.kill('SIGKILL');
    await new Promise((r) => cluster.orchestrator!.child.once('exit', r));
    await cluster.startOrchestrator(FAST); // same port, same data dir
    const restartedAt = Date.now();
    const resumed = await cluster.run(run.id);
    assert.ok(resumed.microbatchesDone >= before.microbatchesDone, 'nothing committed was lost');
    const done = await cluster.waitRun(run.id, (v) => v.status === 'completed' || v.status === 'failed', 180_000);
    assert.equal(done.status, 'completed', JSON.stringify(done));
    assert.equal(done.microbatchesDone, 120);
    assert.ok(done.stages.every((s) => s.replicas.some((r) => r.alive)), 'the miners re-attached');
    // heartbeats resent after the lost replies, deadlines and merge phases restarted: nobody is charged for the downtime
    const charged = (await cluster.api.work()).filter((w) => ['dropped', 'invalid', 'failed_check'].includes(w.kind));
    if (charged.length) {
      const miners = cluster.procs.slice(1).map((p) => p.lines.filter((l) => !l.includes('"event":"progress"')).slice(-40).join('\n'));
      assert.deepEqual(charged, [], `no miner was charged for the orchestrator being down (killed at ${killedAt}, listening again at ${restartedAt}):\n${cluster.chargedDetails()}\n${miners.join('\n---\n')}`);
    }
  } finally {
    await cluster.stop();
  }
});
