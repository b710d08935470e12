// CPU time of processes on this machine (Linux): a child's from
// /proc/PID/stat (user + system clock ticks), this process's from
// process.cpuUsage(). The calibration bench (./sim-calibration.bench.ts) takes
// them over a window of a local network's training.
import { readFileSync } from 'node:fs';

/** Clock ticks per second of /proc/PID/stat (USER_HZ, 100 on Linux builds). */
const USER_HZ = 100;

/** A process's CPU time so far, ms (user + system). */
export function processCpuMs(pid: number): number {
  let stat: string;
  try {
    stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch (err) {
    throw new Error(`cannot read the CPU time of process ${pid} (/proc is Linux's): ${(err as Error).message}`, { cause: err });
  }
  // fields after the command name (in parentheses, which may hold spaces): state is field 3, utime 14, stime 15
  const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return ((Number(rest[11]) + Number(rest[12])) * 1000) / USER_HZ;
}

/** This process's CPU time so far, ms. */
export function ownCpuMs(): number {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
}
