// One busy single-thread process of the crowding measurement
// (./host-crowding.ts), in a process of its own as a miner is. argv: a local
// network's description (JSON, src/sim/calibrate.ts LocalNetwork) and a
// duration in ms. It readies stage 0 of that network the way a miner holds
// it, runs two microbatches to warm up, prints {"event":"ready"}, waits for a
// line on stdin, then runs microbatches (forward and backward, as a miner
// does: stageJobs) for the duration and prints {"event":"done","jobs":N,"ms":M}:
// the microbatches it finished and the median wall time of one (a moment's
// hiccup of the shared machine moves a median little).
import { createInterface } from 'node:readline';
import { Engine } from '../src/engine/engine.ts';
import { loadCorpus } from '../src/data/corpus.ts';
import { StageRunner } from '../src/miner/stage-runner.ts';
import { calibrationFrames, calibrationStage, stageJobs, type LocalNetwork } from '../src/sim/calibrate.ts';

const net = JSON.parse(process.argv[2]) as LocalNetwork;
const durationMs = Number(process.argv[3]);
const engine = await Engine.create({ threads: 1 });
const runner = new StageRunner(engine, calibrationStage(net, 0), 1, loadCorpus('moby-dick'));
await runner.ready();
const frames = calibrationFrames(net);
let k = 0;
for (; k < 2; k++) await stageJobs(runner, k, frames);
process.stdout.write(JSON.stringify({ event: 'ready' }) + '\n');
await new Promise<void>((resolve) => createInterface({ input: process.stdin }).once('line', () => resolve()));
const t0 = performance.now();
const times: number[] = [];
while (performance.now() - t0 < durationMs) {
  const t = await stageJobs(runner, k++, frames);
  times.push(t.forwardMs + t.backwardMs);
}
times.sort((a, b) => a - b);
process.stdout.write(JSON.stringify({ event: 'done', jobs: times.length, ms: times[times.length >> 1] }) + '\n');
runner.dispose();
await engine.close();
process.exit(0);
