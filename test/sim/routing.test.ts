// The simulator's next-hop draw (src/sim/flow.ts drawNextHop) is the draw the
// orchestrator's weights define, and the very one Rng.weighted makes over the
// list of routable replicas: same seed, same pick, on stages with gone,
// downloading and busy replicas.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { peerWeight } from '../../src/orchestrator/issue-policy.ts';
import { drawNextHop } from '../../src/sim/flow.ts';
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
