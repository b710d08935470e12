// How much a process loses to time slicing on this machine, for the
// calibration's shared host (src/sim/host.ts SharedHost.crowdedRate): a
// miner's stage-0 microbatches run in one process alone, then in 2 × cores
// processes at once (./crowding-child.ts, each a process of its own as a
// miner is, all started together once ready), then alone again, each for the
// same wall time; the two runs alone bracket the crowded one, as the
// engine's measurements bracket a run (the machine's speed drifts).
// Fair processor sharing would make a microbatch take processes ÷ cores
// times as long crowded as alone; what it takes beyond that is the loss.
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { crowdedRateOf, type LocalNetwork } from '../src/sim/calibrate.ts';

/** The mean over `processes` children running at once for `durationMs` of each one's median ms of a microbatch. */
async function runChildren(net: LocalNetwork, processes: number, durationMs: number): Promise<number> {
  const children = Array.from({ length: processes }, () =>
    spawn(process.execPath, ['--import', 'tsx', new URL('./crowding-child.ts', import.meta.url).pathname, JSON.stringify(net), String(durationMs)], { stdio: ['pipe', 'pipe', 'inherit'] }),
  );
  try {
    const lines = children.map((c) => {
      const events: Record<string, unknown>[] = [];
      const waiters: (() => void)[] = [];
      createInterface({ input: c.stdout! }).on('line', (line) => {
        events.push(JSON.parse(line) as Record<string, unknown>);
        waiters.splice(0).forEach((w) => w());
      });
      const exited = new Promise<never>((_, reject) => c.once('exit', (code) => reject(new Error(`a crowding child exited (${code}) early`))));
      exited.catch(() => {});
      return async (event: string): Promise<Record<string, unknown>> => {
        for (;;) {
          const found = events.find((e) => e.event === event);
          if (found) return found;
          await Promise.race([new Promise<void>((r) => waiters.push(r)), exited]);
        }
      };
    });
    await Promise.all(lines.map((next) => next('ready')));
    for (const c of children) c.stdin!.write('go\n');
    const done = await Promise.all(lines.map((next) => next('done')));
    const perJob = done.map((d) => Number(d.ms));
    return perJob.reduce((a, x) => a + x, 0) / perJob.length;
  } finally {
    for (const c of children) if (c.exitCode === null) c.kill();
  }
}

/** SharedHost.crowdedRate on this machine's `cores`, and the two means it comes from. */
export async function measureCrowdedRate(net: LocalNetwork, cores: number, durationMs = 4000): Promise<{ crowdedRate: number; aloneMs: number; crowdedMs: number; processes: number }> {
  const before = await runChildren(net, 1, durationMs);
  const processes = 2 * cores;
  const crowdedMs = await runChildren(net, processes, durationMs);
  const aloneMs = (before + (await runChildren(net, 1, durationMs))) / 2;
  return { crowdedRate: crowdedRateOf(aloneMs, crowdedMs, processes, cores), aloneMs, crowdedMs, processes };
}
