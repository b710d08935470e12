// The simulator's next-hop draw (src/sim/flow.ts drawNextHop) is the draw the
// orchestrator's weights define: on small stages the very one Rng.weighted
// makes over the list of routable replicas (same seed, same pick), on large
// ones a rejection draw with the same law (checked by its frequencies).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { peerWeight } from '../../src/orchestrator/training/issue-policy.ts';
import { drawNextHop, REJECTION_MIN_REPLICAS } from '../../src/sim/flow.ts';
import { Rng } from '../../src/sim/rng.ts';
import { simOptions, simulateWorld } from '../../src/sim/simulate.ts';
import type { SimMiner } from '../../src/sim/types.ts';

test('the next hop is drawn as Rng.weighted draws over the routable replicas, pick for pick; none when no replica is routable', () => {
  const { world } = simulateWorld(simOptions({ modelName: 'gpt-tiny', miners: 40, stages: 3, hours: 0.02, churn: 0, seed: 7 }));
  const shuffle = new Rng(99);
  let picks = 0;
  for (let round = 0; round < 300; round++) {
    // vary what routing looks at: queues, departures noticed, downloads not done
    for (const m of world.miners) {
      m.queue.length = 0;
      for (let q = Math.floor(shuffle.next() * 4); q > 0; q--) m.queue.push({ kind: 'forward', mb: 0, attempt: 1 });
      m.gone = shuffle.next() < 0.2;
      m.readyAt = shuffle.next() < 0.2 ? world.now + 1000 : 0;
    }
    for (let s = 0; s < world.stageCount; s++) {
      const routable: SimMiner[] = [...world.members[s]].map((i) => world.miners[i]).filter((m) => !m.gone && m.readyAt <= world.now);
      const a = new Rng(round * 31 + s);
      const b = new Rng(round * 31 + s);
      const got = drawNextHop(world, s, a);
      if (routable.length === 0) {
        assert.equal(got, null);
        assert.equal(a.next(), b.next(), 'no number drawn');
        continue;
      }
      const want = routable[b.weighted(routable.map((m) => peerWeight(m.gflops, m.queue.length)))];
      assert.equal(got, want, `round ${round}, stage ${s}`);
      picks++;
    }
  }
  assert.ok(picks > 500, `${picks} picks compared`);
});

test('on a stage of many replicas the next hop is drawn by rejection with the same law: frequencies match peerWeight over the routable replicas', () => {
  const { world } = simulateWorld(simOptions({ modelName: 'gpt-tiny', miners: 300, stages: 2, hours: 0.001, churn: 0, seed: 3 }));
  const stage = world.memberLists.findIndex((m) => m.list.length >= REJECTION_MIN_REPLICAS);
  assert.ok(stage >= 0, `a stage of ${REJECTION_MIN_REPLICAS} replicas or more (sizes ${world.memberLists.map((m) => m.list.length)})`);
  const shuffle = new Rng(5);
  const members = world.memberLists[stage].list.map((i) => world.miners[i]);
  for (const m of members) {
    m.queue.length = 0;
    for (let q = Math.floor(shuffle.next() * 6); q > 0; q--) m.queue.push({ kind: 'forward', mb: 0, attempt: 1 });
    m.gone = shuffle.next() < 0.2;
    m.readyAt = shuffle.next() < 0.2 ? world.now + 1000 : 0;
  }
  const routable = members.filter((m) => !m.gone && m.readyAt <= world.now);
  const weights = routable.map((m) => peerWeight(m.gflops, m.queue.length));
  const total = weights.reduce((a, b) => a + b, 0);
  const draws = 200_000;
  const counts = new Map<SimMiner, number>();
  const rng = new Rng(11);
  for (let i = 0; i < draws; i++) {
    const got = drawNextHop(world, stage, rng)!;
    assert.ok(routable.includes(got), 'only routable replicas are drawn');
    counts.set(got, (counts.get(got) ?? 0) + 1);
  }
  // chi-square over the routable replicas: with ~100 degrees of freedom, 5 standard deviations above the mean is ~170
  let chi2 = 0;
  routable.forEach((m, i) => {
    const expected = (draws * weights[i]) / total;
    chi2 += ((counts.get(m) ?? 0) - expected) ** 2 / expected;
  });
  const dof = routable.length - 1;
  assert.ok(chi2 < dof + 5 * Math.sqrt(2 * dof), `chi-square ${chi2.toFixed(1)} with ${dof} degrees of freedom`);

  // nobody routable: none, after the rejection tries and the linear pass
  for (const m of members) m.gone = true;
  assert.equal(drawNextHop(world, stage, rng), null);
});

test("what-if route 'two-choices': of two draws by the network's law the sender takes the larger peerWeight, pick for pick", () => {
  const { world } = simulateWorld(simOptions({ modelName: 'gpt-tiny', miners: 40, stages: 3, hours: 0.02, churn: 0, seed: 7, route: 'two-choices' }));
  const shuffle = new Rng(4);
  let differs = 0;
  for (let round = 0; round < 200; round++) {
    for (const m of world.miners) {
      m.queue.length = 0;
      for (let q = Math.floor(shuffle.next() * 4); q > 0; q--) m.queue.push({ kind: 'forward', mb: 0, attempt: 1 });
      m.gone = false;
      m.readyAt = 0;
    }
    for (let s = 0; s < world.stageCount; s++) {
      const routable = [...world.members[s]].map((i) => world.miners[i]);
      const weights = routable.map((m) => peerWeight(m.gflops, m.queue.length));
      const b = new Rng(round * 31 + s);
      const [x, y] = [routable[b.weighted(weights)], routable[b.weighted(weights)]];
      const want = peerWeight(y.gflops, y.queue.length) > peerWeight(x.gflops, x.queue.length) ? y : x;
      assert.equal(drawNextHop(world, s, new Rng(round * 31 + s)), want, `round ${round}, stage ${s}`);
      if (want !== x) differs++;
    }
  }
  assert.ok(differs > 50, `the second draw was taken ${differs} times`);
  assert.throws(() => simOptions({ modelName: 'gpt-tiny', miners: 4, route: 'shortest' as never }), /route must be one of weighted, two-choices, got shortest/);
});
