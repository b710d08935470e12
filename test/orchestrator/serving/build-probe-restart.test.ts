// The cross-build probe survives a restart (src/orchestrator/serving/build-probe.ts,
// src/orchestrator/state/build-probes.ts), on real engines of both kernel
// builds and a real state (SQLite file, or PostgreSQL with NIMBLE_TEST_DB=postgres):
// an orchestrator probes a model with opposing weights (thresholds looser
// than the training checks') and one no check can hold (refused); the state
// is closed and opened again, as a restart does, and a new BuildProbes on it
// gives the same thresholds and the same refusal without running a kernel
// (its engines would throw if asked) and without reading the model file. A
// deleted model's probe goes with it.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { rmSync } from 'node:fs';
import { after, before, test } from 'node:test';
import { Engine } from '../../../src/engine/engine.ts';
import { gptConfig } from '../../../src/model/config.ts';
import { partCount } from '../../../src/model/parts.ts';
import { FsBlobStore } from '../../../src/orchestrator/blobs/blobs.ts';
import { StoreBudget } from '../../../src/orchestrator/blobs/store-budget.ts';
import { BuildProbes } from '../../../src/orchestrator/serving/build-probe.ts';
import { OrchestratorState } from '../../../src/orchestrator/state/index.ts';
import { CHECK_THRESHOLDS } from '../../../src/orchestrator/training/spot-check-verify.ts';
import { NimbleError } from '../../../src/protocol/errors.ts';
import { tempDir } from '../../chain/helpers.ts';
import { opposingWeightsBytes } from '../../helpers/whole-model.ts';
import { stateTarget } from '../helpers.ts';

const P = partCount(gptConfig('gpt-micro'));
let relaxed: Engine;
let dir: string;
before(async () => {
  relaxed = await Engine.create({ threads: 1, simd: 'relaxed' });
  dir = tempDir('probe-restart');
});
after(async () => {
  await relaxed?.close();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

test("a deployment's probe thresholds and a refusal survive a restart: the model is not probed again", { timeout: 120_000 }, async () => {
  const target = await stateTarget(dir, 'probe.sqlite');
  const blobs = await FsBlobStore.open(`${dir}/blobs`);
  const loose = opposingWeightsBytes(3e4);
  const unstable = opposingWeightsBytes(1e6);
  const [looseSha, unstableSha] = [loose, unstable].map((b) => createHash('sha256').update(b).digest('hex'));
  await blobs.put(loose);
  await blobs.put(unstable);

  // before the restart: both probed on the two builds (the orchestrator's checks replay on relaxed SIMD)
  let state = OrchestratorState.open(target);
  const lines: string[] = [];
  const first = new BuildProbes({ blobs, store: state.buildProbes, engine: async () => relaxed, log: (l) => lines.push(l) });
  const before: Awaited<ReturnType<BuildProbes['thresholds']>>[] = [];
  for (let to = 1; to <= P; to++) before.push(await first.thresholds(looseSha, 0, to));
  assert.ok(before.some((t) => t.maxNormDeviation > CHECK_THRESHOLDS.f16.maxNormDeviation || t.minCosine < CHECK_THRESHOLDS.f16.minCosine), `the probe loosened some range: ${JSON.stringify(before)}`);
  await assert.rejects(first.checkDeployable(unstableSha, 'unstable'), (e: unknown) => e instanceof NimbleError && e.code === 'unstable_model');
  assert.equal(lines.filter((l) => /ranges of parts in \d+ ms/.test(l)).length, 2, lines.join('\n'));
  await first.close(); // the other build's engine it made
  state.close();

  // the restart: the state opened again, engines and blob store that fail if the probe ran again
  state = OrchestratorState.open(target);
  const noKernels = async (): Promise<Engine> => {
    throw new Error('probed again after the restart');
  };
  const noFiles = { ...blobs, get: async () => assert.fail('read the model file again'), size: async () => assert.fail('read the model file again') } as unknown as FsBlobStore;
  const after = new BuildProbes({ blobs: noFiles, store: state.buildProbes, engine: noKernels, log: (l) => lines.push(l) });
  for (let to = 1; to <= P; to++) assert.deepEqual(await after.thresholds(looseSha, 0, to), before[to - 1], `range [0, ${to}) keeps its thresholds`);
  await assert.rejects(after.checkDeployable(unstableSha, 'unstable'), (e: unknown) => e instanceof NimbleError && e.code === 'unstable_model' && /would not catch a miner/.test(e.message));
  assert.ok(!lines.some((l) => /failed/.test(l)), lines.join('\n'));

  // a deleted model's probe goes with it
  new StoreBudget(state, null).remove(looseSha);
  assert.equal(state.buildProbes.get(looseSha), undefined);
  assert.ok(state.buildProbes.get(unstableSha));
  state.close();
});
