// The serving cheat's hook (Tamper.inference through tamperedServing): a
// served stage whose `run` answers are altered, everything else (sessions,
// positions, config) the stage's own; an honest miner's stage is served as
// it is.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Engine } from '../../src/engine/engine.ts';
import { inferenceFromCheckpoint } from '../../src/inference/load.ts';
import type { ServedStage } from '../../src/miner/deployment.ts';
import { tamperedServing } from '../../src/miner/tamper.ts';
import type { DeploymentAssignment } from '../../src/protocol/messages.ts';
import { wholeModelBytes } from '../helpers/whole-model.ts';

test('tamperedServing alters what run answers and passes the rest through', async () => {
  const engine = await Engine.create({ threads: 1 });
  const bytes = wholeModelBytes(3);
  const honest = inferenceFromCheckpoint(engine, bytes, { from: 0, to: 2 }, { maxSessions: 2 });
  const twin = inferenceFromCheckpoint(engine, bytes, { from: 0, to: 2 }, { maxSessions: 2 });
  try {
    const served: ServedStage = { assignment: {} as DeploymentAssignment, inference: twin, sha256: 'a'.repeat(64), verifiedBy: 'sha256' };
    assert.equal(tamperedServing(served, undefined), served);
    assert.equal(tamperedServing(null, () => {}), null);
    const cheat = tamperedServing(served, (out) => out.forEach((v, i) => (out[i] = v + 1)))!;
    assert.notEqual(cheat.inference, twin);
    const input = Int32Array.from([10, 20, 30]);
    honest.join('s');
    cheat.inference.join('s');
    assert.ok(twin.has('s'), 'join reached the stage itself');
    const want = honest.run([{ session: 's', input }]);
    const got = cheat.inference.run([{ session: 's', input }]);
    assert.equal(got.length, want.length);
    assert.ok(got.every((v, i) => v === want[i] + 1 || Math.abs(v - (want[i] + 1)) < 1e-6));
    assert.equal(cheat.inference.position('s'), 3);
    assert.equal(cheat.inference.isFirst, true);
    assert.deepEqual(cheat.inference.config, twin.config);
    assert.deepEqual(cheat.inference.sessionIds(), ['s']);
    cheat.inference.leave('s');
    assert.equal(twin.has('s'), false);
  } finally {
    honest.release();
    twin.release();
    await engine.close();
  }
});
