// The hardware table (built in, and read from a file with clear errors) and
// `nbcli simulate` end to end.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { Command } from 'commander';
import { registerSimulate } from '../../src/cli/sim/simulate.ts';
import { DEFAULT_HARDWARE, drawMiner, loadHardwareFile, validateHardwareTable } from '../../src/sim/hardware.ts';
import { modelParams, simModel } from '../../src/sim/models.ts';
import { Rng } from '../../src/sim/rng.ts';
import { nbcliArgv } from '../helpers/nbcli.ts';

/** nbcli as a child process (the build when fresh: test/helpers/nbcli.ts) */
const [node, ...pre] = nbcliArgv();

const root = fileURLToPath(new URL('../..', import.meta.url));
const dir = mkdtempSync(join(tmpdir(), 'nimble-sim-'));
after(() => rmSync(dir, { recursive: true, force: true }));

function nbcli(...args: string[]) {
  return spawnSync(node, [...pre, ...args], { cwd: root, encoding: 'utf8', timeout: 60_000 });
}

test('the built-in table validates, and miners are drawn in proportion to the shares', () => {
  assert.equal(validateHardwareTable(DEFAULT_HARDWARE), DEFAULT_HARDWARE);
  const rng = new Rng(1);
  const counts = new Map<string, number>();
  for (let i = 0; i < 20_000; i++) {
    const m = drawMiner(DEFAULT_HARDWARE, rng, i);
    counts.set(m.hardware, (counts.get(m.hardware) ?? 0) + 1);
  }
  const total = DEFAULT_HARDWARE.classes.reduce((a, c) => a + c.share, 0);
  for (const c of DEFAULT_HARDWARE.classes) {
    const got = (counts.get(c.name) ?? 0) / 20_000;
    assert.ok(Math.abs(got - c.share / total) < 0.015, `${c.name}: ${got} vs ${c.share / total}`);
  }
});

test('a hardware file is validated with clear errors', () => {
  const write = (name: string, text: string): string => {
    const p = join(dir, name);
    writeFileSync(p, text);
    return p;
  };
  const good = { classes: [{ name: 'gpu', share: 1, gflops: 1000, memoryGB: 24, upMbps: 100, downMbps: 500, latencyMs: 20, sessionHours: 8 }] };
  assert.deepEqual(loadHardwareFile(write('good.json', JSON.stringify(good))), good);
  assert.throws(() => loadHardwareFile(join(dir, 'missing.json')), /cannot read hardware table .*missing\.json/);
  assert.throws(() => loadHardwareFile(write('bad.json', '{ nope')), /invalid hardware table .*bad\.json: not JSON/);
  const without = { classes: [{ ...good.classes[0], upMbps: undefined }] };
  assert.throws(() => loadHardwareFile(write('nofield.json', JSON.stringify(without))), /invalid hardware table .*: \/classes\/0/);
  const negative = { classes: [{ ...good.classes[0], gflops: -5 }] };
  assert.throws(() => loadHardwareFile(write('neg.json', JSON.stringify(negative))), /\/classes\/0\/gflops/);
  const extra = { classes: [{ ...good.classes[0], color: 'red' }] };
  assert.throws(() => loadHardwareFile(write('extra.json', JSON.stringify(extra))), /\/classes\/0/);
  assert.throws(() => loadHardwareFile(write('empty.json', JSON.stringify({ classes: [] }))), /\/classes/);
  const twice = { classes: [good.classes[0], good.classes[0]] };
  assert.throws(() => loadHardwareFile(write('twice.json', JSON.stringify(twice))), /class 'gpu' is listed twice/);
});

test('named models span gpt-tiny to 100B parameters', () => {
  assert.equal(modelParams(simModel('gpt-tiny')), 867_072);
  const big = modelParams(simModel('gpt-100b'));
  assert.ok(big > 100e9 && big < 103e9, `${big}`);
  assert.throws(() => simModel('gpt-7t'), /unknown model 'gpt-7t' \(known: .*gpt-100b/);
});

test('nbcli simulate --json reports the run and --chart writes the SVG', () => {
  const chart = join(dir, 'run.svg');
  const r = nbcli('simulate', '--miners', '16', '--model', 'gpt-tiny', '--hours', '0.1', '--stages', '2', '--seed', '4', '--json', '--chart', chart);
  assert.equal(r.status, 0, r.stderr);
  const report = JSON.parse(r.stdout);
  assert.equal(report.model, 'gpt-tiny');
  assert.equal(report.miners, 16);
  assert.equal(report.stages.length, 2);
  assert.equal(report.memoryModel, 'engine');
  for (const s of report.stages) assert.ok(s.params > 0 && s.memoryBytes > 0 && s.replicas >= 1);
  assert.ok(report.tokensPerS > 0 && report.utilization > 0 && report.utilization <= 1);
  assert.ok(report.bytesPerToken.activations > 0);
  assert.ok(report.merges.rounds >= 0 && typeof report.merges.meanMs === 'number');
  assert.ok(Array.isArray(report.classes) && report.classes.length > 0);
  assert.equal(report.series.tMs.length, report.series.tokensPerS.length);
  const svg = readFileSync(chart, 'utf8');
  assert.match(svg, /^<svg xmlns="http:\/\/www.w3.org\/2000\/svg"/);
  assert.match(svg, /<path d="M[0-9.]+,[0-9.]+ L/);
  assert.match(svg, /training tokens\/s/);
  // the human view names the same figures
  const human = nbcli('simulate', '--miners', '16', '--model', 'gpt-tiny', '--hours', '0.1', '--stages', '2', '--seed', '4', '--memory-model', 'bf16-offload', '--slots', '3', '--activation-ratio', '4');
  assert.equal(human.status, 0, human.stderr);
  assert.match(human.stdout, /stages: 2/);
  assert.match(human.stdout, /memory model bf16-offload/);
  assert.match(human.stdout, /3 slots, activations f16 ÷ 4\.0 \(what-if\)/);
  assert.match(human.stdout, /earnings per class:/);
});

test('nbcli simulate refuses bad flags with clear errors', async () => {
  const cases: [string[], RegExp][] = [
    [['--miners', '0', '--model', 'gpt-tiny'], /--miners must be a positive integer, got '0'/],
    [['--miners', '4', '--model', 'gpt-huge'], /unknown model 'gpt-huge'/],
    [['--miners', '4', '--model', 'gpt-tiny', '--churn', '-1'], /--churn must be a number in \[0, 1000\], got '-1'/],
    [['--miners', '4', '--model', 'gpt-tiny', '--hours', 'x'], /--hours must be a number/],
    [['--miners', '4', '--model', 'gpt-tiny', '--codec', 'int8-block'], /--codec must be f32, f16 or int8-row/],
    [['--miners', '4', '--model', 'gpt-tiny', '--memory-model', 'fp8'], /--memory-model must be one of engine, bf16, bf16-offload, bf16-offload-recompute, got 'fp8'/],
    [['--miners', '4', '--model', 'gpt-tiny', '--hardware', join(dir, 'nope.json')], /cannot read hardware table/],
    [['--miners', '4', '--model', 'gpt-tiny', '--slots', '0'], /--slots must be a positive integer, got '0'/],
    [['--miners', '4', '--model', 'gpt-tiny', '--slots', '257'], /slots must be an integer in \[1, 256\], got 257/],
    [['--miners', '4', '--model', 'gpt-tiny', '--activation-ratio', '0.5'], /--activation-ratio must be a number in \[1, 1000000\], got '0.5'/],
    [['--miners', '1', '--model', 'gpt-tiny', '--stages', '3'], /cannot simulate: 3 stages need at least 3 miners; 1 available/],
    [['--miners', '4', '--model', 'gpt-tiny', '--max-events', '0'], /--max-events must be a positive integer, got '0'/],
    [['--miners', '4', '--model', 'gpt-tiny', '--max-events', '100'], /cannot simulate: more than 100 events by simulated [0-9.]+ min: simulate fewer hours or miners, or allow more events \(--max-events\)/],
  ];
  // one through a process (exit code 1, one `nbcli:` line), the others in this one: each process costs seconds of module loading
  const [[firstArgs, firstMessage], ...rest] = cases;
  const r = nbcli('simulate', ...firstArgs);
  assert.equal(r.status, 1, r.stdout);
  assert.match(r.stderr, /^nbcli: /);
  assert.match(r.stderr, firstMessage);
  for (const [args, message] of rest) {
    const program = new Command('nbcli').exitOverride();
    registerSimulate(program);
    await assert.rejects(program.parseAsync(['node', 'nbcli', 'simulate', ...args]), message, args.join(' '));
  }
});
