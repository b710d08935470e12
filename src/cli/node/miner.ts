// nbcli miner start: join a network and train the stage it assigns, or serve a
// stage of a deployed model (--serve inference|training|both). A deployed
// model's weights are checked against the ModelRegistry of the chain the
// orchestrator names, checked on its RPC or on --chain-rpc (src/miner/chain.ts).
// --orchestrator may name
// several orchestrators of one network (URL,URL... or the flag repeated): the
// miner moves to the next when the one it talks to stops answering.
import { NimbleError } from '../../protocol/errors.ts';
import { join } from 'node:path';
import type { Command } from 'commander';
import { BACKEND_CHOICES, SIMD_CHOICES, type BackendChoice, type SimdChoice } from '../../engine/engine.ts';
import { Miner } from '../../miner/miner.ts';
import type { ServeSetting } from '../../protocol/messages.ts';
import { chainRpcOf } from '../chain-options.ts';
import { emit, parseBytes, parsePositiveInt, resolveDataDir, waitForSignal, withCommonOptions, type CommonOptions } from '../common.ts';
import { signingKey } from '../keys.ts';

interface Flags extends CommonOptions {
  'wallet.name'?: string;
  orchestrator: string[];
  name?: string;
  threads?: string;
  throttle: string;
  host: string;
  port: string;
  slots: string;
  mergeDelayMs: string;
  memory?: string;
  gpuMemory?: string;
  serve: string;
  backend: string;
  simd: string;
  chainRpc?: string;
}

const SERVE_SETTINGS: readonly ServeSetting[] = ['inference', 'training', 'both'];

/** Collects a repeated flag's values. */
function collect(value: string, previous: string[] | undefined): string[] {
  return [...(previous ?? []), value];
}

/**
 * The orchestrator URLs of --orchestrator's values (each one URL or several
 * separated by commas), without trailing slashes; throws an 'invalid'
 * NimbleError naming the first that is not an http(s) URL, or one given twice.
 */
export function parseOrchestratorUrls(values: readonly string[]): string[] {
  const urls: string[] = [];
  for (const given of values.flatMap((v) => v.split(','))) {
    const text = given.trim();
    let url: URL | null = null;
    try {
      url = new URL(text);
    } catch {
      // said below
    }
    if (!url || (url.protocol !== 'http:' && url.protocol !== 'https:')) throw new NimbleError('invalid', `--orchestrator: '${text}' is not an http(s) URL (give one, or several separated by commas)`);
    const href = url.href.replace(/\/$/, '');
    if (urls.includes(href)) throw new NimbleError('invalid', `--orchestrator names ${href} twice`);
    urls.push(href);
  }
  if (urls.length === 0) throw new NimbleError('invalid', '--orchestrator needs a URL');
  return urls;
}

export function registerMiner(program: Command): void {
  const group = program.command('miner').description('run a miner');
  withCommonOptions(
    group
      .command('start')
      .description('join a network and train the stage the orchestrator assigns')
      .requiredOption('--orchestrator <url,...>', 'the orchestrator, e.g. http://127.0.0.1:7070; or several of one network, separated by commas or with the flag repeated (it moves to the next when one stops answering)', collect)
      .option('--name <name>', 'a name shown in the dashboard')
      .option('--threads <n>', 'engine threads (default: every core)')
      .option('--throttle <f>', 'use only this share of the time, 0 < f <= 1', '1')
      .option('--host <host>', 'address for peer traffic', '127.0.0.1')
      .option('--port <port>', 'port for peer traffic (0: any free port)', '0')
      .option('--slots <n>', 'microbatches in flight', '3')
      .option('--memory <size>', 'memory offered to the planner, e.g. 512MB or 2GiB (default: the free memory; never more than it; on wasm at most 4 GiB, what a WebAssembly memory holds)')
      .option('--gpu-memory <size>', "the GPU's memory, e.g. 24GiB, with --backend webgpu: WebGPU does not report it (default: the free host memory; a stage the GPU cannot hold is refused when it is taken)")
      .option('--merge-delay-ms <ms>', 'wait this long before merging partitions (for failure testing)', '0')
      .option('--serve <what>', 'what this miner offers: inference (serve deployed models), training, or both', 'both')
      .option('--backend <b>', 'where stages train (GPT or MLP): wasm (the CPU), webgpu (the GPU; a software adapter is taken too, for tests) or auto (a hardware GPU if there is one, else wasm)', 'wasm')
      .option('--simd <build>', 'the WASM kernel build: auto (relaxed SIMD, with fused multiply-add, where the runtime has it), relaxed or plain (the two round differently; inference spot checks accept either)', 'auto')
      .option('--chain-rpc <url>', "check deployed models' weights against the ModelRegistry on the chain at this RPC URL (addresses from <data-dir>/chain/deployment.json; default: the local node of the data dir, if it has one; $NIMBLE_CHAIN_RPC)")
      .option('--wallet.name <name>', 'sign with this wallet (<data-dir>/wallets/NAME.json; password from $NIMBLE_PASSWORD or a prompt) instead of <data-dir>/miner/miner-key.json'),
  ).action(async (flags: Flags) => {
    const orchestrator = parseOrchestratorUrls(flags.orchestrator);
    const throttle = Number(flags.throttle);
    if (!(throttle > 0 && throttle <= 1)) throw new NimbleError('invalid', `--throttle must be in (0, 1], got '${flags.throttle}'`);
    const port = Number(flags.port);
    if (!Number.isInteger(port) || port < 0 || port > 65535) throw new NimbleError('invalid', `--port must be 0-65535, got '${flags.port}'`);
    const threads = flags.threads === undefined ? undefined : parsePositiveInt('--threads', flags.threads, 1);
    const slots = parsePositiveInt('--slots', flags.slots, 3);
    // a heartbeat reports up to 2 × slots free (src/protocol/messages.ts allows 4096)
    if (slots > 2048) throw new NimbleError('invalid', `--slots must be at most 2048, got ${slots}`);
    const dataDir = join(resolveDataDir(flags), 'miner');
    const log = (line: string): void => {
      if (flags.json) process.stdout.write(JSON.stringify({ event: 'log', message: line }) + '\n');
      else process.stderr.write(`[${flags.name ?? 'miner'}] ${line}\n`);
    };
    const mergeDelayMs = Number(flags.mergeDelayMs);
    if (!(mergeDelayMs >= 0)) throw new NimbleError('invalid', `--merge-delay-ms must be a non-negative number, got '${flags.mergeDelayMs}'`);
    const memoryBytes = flags.memory === undefined ? undefined : parseBytes('--memory', flags.memory);
    const gpuMemoryBytes = flags.gpuMemory === undefined ? undefined : parseBytes('--gpu-memory', flags.gpuMemory);
    if (!(SERVE_SETTINGS as readonly string[]).includes(flags.serve)) throw new NimbleError('invalid', `--serve must be inference, training or both, got '${flags.serve}'`);
    const serve = flags.serve as ServeSetting;
    if (!(BACKEND_CHOICES as readonly string[]).includes(flags.backend)) throw new NimbleError('invalid', `--backend must be ${BACKEND_CHOICES.join(', ')}, got '${flags.backend}'`);
    const backend = flags.backend as BackendChoice;
    if (!(SIMD_CHOICES as readonly string[]).includes(flags.simd)) throw new NimbleError('invalid', `--simd must be ${SIMD_CHOICES.join(', ')}, got '${flags.simd}'`);
    const simd = flags.simd as SimdChoice;
    // a miner that serves checks deployed models on the chain its orchestrator names (src/miner/chain.ts)
    const chain = { rpcUrl: chainRpcOf(flags), dataDir: resolveDataDir(flags) };
    const privateKey = await signingKey(flags, 'miner-key.json', dataDir);
    const miner = await Miner.start({ orchestrator, dataDir, name: flags.name, threads, throttle, host: flags.host, port, slots, log, mergeDelayMs, privateKey, memoryBytes, gpuMemoryBytes, serve, chain, backend, simd });
    emit(flags, { event: 'started', address: miner.address, url: miner.url, serve, backend: miner.backend, chain: serve !== 'training' }, () => `miner ${miner.address} serving peers on ${miner.url} (offers ${serve === 'both' ? 'training and inference' : serve}, trains on ${miner.backend})`);
    await waitForSignal();
    await miner.stop();
    emit(flags, { event: 'stopped', stats: miner.stats }, () => `miner stopped: ${miner.stats.forward} forward, ${miner.stats.backward} backward, ${miner.stats.merges} partitions merged`);
  });
}
