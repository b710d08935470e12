// nbcli up: a whole local network in one command: an orchestrator, N miner
// child processes of different speeds, a gpt-tiny run on Moby Dick, progress,
// and at the end the held-out loss and a generated sample. With --job FILE
// the network trains that job instead (./up-job.ts).
import { showNim } from '../../chain/amounts.ts';
import { displayNim } from '../../chain/nim-display.ts';
import { childEnv } from '../../protocol/child-env.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { spawn, type ChildProcess } from 'node:child_process';
import { createWriteStream, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Command } from 'commander';
import type { Hex } from 'viem';
import { loadCorpus } from '../../data/corpus.ts';
import { Engine } from '../../engine/engine.ts';
import { loadStageFrom } from '../../model/checkpoint.ts';
import { gptConfig } from '../../model/config.ts';
import { generateCached } from '../../inference/generate.ts';
import { GptStage } from '../../model/gpt.ts';
import { partCount } from '../../model/parts.ts';
import { decodeSafetensors } from '../../model/safetensors.ts';
import { startOrchestrator } from '../../orchestrator/server.ts';
import { OrchestratorClient } from '../../api/client.ts';
import { loadOrCreateKeyFile } from '../../chain/key-file.ts';
import { heldoutLoss } from '../../train/local.ts';
import { generatePrivateKey } from 'viem/accounts';
import { formatEther, parseEther } from 'viem';
import { signerFor, type ChainClient } from '../../chain/client.ts';
import { addStake, readStake } from '../../chain/staking.ts';
import { faucet } from '../../chain/token.ts';
import { loadWalletFile, saveWallet, unlockWallet, walletsDir } from '../../chain/wallets.ts';
import type { ChainOptions } from '../../orchestrator/rewards/epochs.ts';
import { emit, parsePositiveInt, resolveDataDir, waitForSignal, withCommonOptions } from '../common.ts';
import { describeRun, followRun } from '../run/follow.ts';
import { readJobSpec } from '../job/job-spec-file.ts';
import { DEVELOPER_KEY_FILE } from '../keys.ts';
import { orchestratorChain, withOrchestratorChainOptions, type OrchestratorChainFlags } from '../node/orchestrator-chain.ts';
import { describeEpoch } from '../chain/rewards.ts';
import { nbcliArgv } from '../self.ts';
import { trainUpJob, UP_JOB_MINER_WAIT_MS, waitForMiners } from './up-job.ts';
import { serveUpModel } from './up-serve.ts';
import { isLocalData, packJobData } from '../job/job-data.ts';

/** Password of the demo miners' wallets when $NIMBLE_PASSWORD is not set (local chain only). */
export const UP_DEMO_PASSWORD = 'nimble-up-demo';

interface Flags extends OrchestratorChainFlags {
  stake?: string;
  miners: string;
  steps?: string;
  stages: string;
  model: string;
  mergeEvery?: string;
  evalBatches: string;
  job?: string;
  port: string;
  /** false with --no-demo: train nothing, serve what the developer brings */
  demo: boolean;
}

/** Options of the demo run, which --job replaces. */
const RUN_OPTIONS = ['steps', 'stages', 'model', 'mergeEvery', 'evalBatches'] as const;

/** Throttles of the demo miners, so the network is heterogeneous. */
const THROTTLES = [1, 0.8, 0.6, 0.45, 0.9, 0.7, 0.5, 0.35];
const DEFAULT_STEPS = 2000;
/** The orchestrator's port, the one nbcli's commands reach unless told (DEFAULT_ORCHESTRATOR). */
const DEFAULT_PORT = 7070;

/** `mergeEvery` → `--merge-every`. */
const flagName = (option: string): string => `--${option.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}`;

function parsePort(value: string): number {
  const port = Number(value);
  if (!/^\d+$/.test(value.trim()) || !Number.isInteger(port) || port > 65535) throw new NimbleError('invalid', `--port must be 0-65535, got '${value}'`);
  return port;
}

/** What `up --no-demo` prints once its miners joined: the commands that bring a model onto this network (docs/models.md). */
function bringYourModel(url: string, miners: number): string {
  return [
    `the network serves with ${miners} miner${miners === 1 ? '' : 's'}; Ctrl+C stops every process. Bring a Hugging Face model folder (docs/models.md):`,
    '  nbcli wallet create --wallet.name dev',
    `  nbcli model import DIR --name NAME --wallet.name dev --orchestrator ${url}`,
    `  nbcli model deploy NAME --stages 2 --wallet.name dev --wait --orchestrator ${url}`,
    `  nbcli api-key create --wallet.name dev --orchestrator ${url}`,
    `then any OpenAI client on ${url}/v1 with that key (or: nbcli generate --chat --model NAME --api-key KEY --orchestrator ${url})`,
  ].join('\n');
}

export function registerUp(program: Command): void {
  withCommonOptions(withOrchestratorChainOptions(
    program
      .command('up')
      .description('start a local network (orchestrator + miners) and train gpt-tiny on Moby Dick, or a job (--job FILE)')
      .option('--job <file>', 'train this job spec (nimble.job.json) instead: submit it, follow it, print how to download its checkpoints, keep serving')
      .option('--no-demo', 'train nothing: start the network and serve until Ctrl+C, for the models you import and deploy (docs/models.md) and the jobs you submit')
      .option('--port <port>', "the orchestrator's port on 127.0.0.1 (0: any free port)", String(DEFAULT_PORT))
      .option('--miners <n>', 'miner child processes', '4')
      .option('--steps <n>', `microbatches to train; exit when done (without: ${DEFAULT_STEPS}, then keep serving until Ctrl+C)`)
      .option('--stages <n>', 'pipeline stages', '2')
      .option('--model <name>', 'model config', 'gpt-tiny')
      .option('--merge-every <h>', 'inner steps per replica between merges')
      .option('--eval-batches <n>', 'held-out batches for the final loss', '200')
      .option('--stake <nim>', "faucet and stake this much NIM in each demo miner's wallet (default: --min-stake)"),
  )).action(async (flags: Flags, cmd: Command) => {
    const minerCount = parsePositiveInt('--miners', flags.miners, 4);
    const spec = flags.job === undefined ? null : readJobSpec(flags.job);
    const packed = spec && isLocalData(spec.data) ? packJobData(spec, flags.job!) : undefined; // a bad data path fails before anything starts
    const given = RUN_OPTIONS.filter((o) => cmd.getOptionValueSource(o) === 'cli');
    if (!flags.demo && spec) throw new NimbleError('invalid', '--no-demo trains nothing; --job trains a job: give one of them');
    if (!flags.demo && given.length) throw new NimbleError('invalid', `--no-demo trains nothing; ${given.map(flagName).join(', ')} ${given.length === 1 ? 'is' : 'are'} for the demo run only`);
    if (spec && given.length) throw new NimbleError('invalid', `--job trains the job as its spec says; ${given.map(flagName).join(', ')} ${given.length === 1 ? 'is' : 'are'} for the demo run only`);
    const steps = parsePositiveInt('--steps', flags.steps, DEFAULT_STEPS);
    const stages = parsePositiveInt('--stages', flags.stages, 2);
    const evalBatches = parsePositiveInt('--eval-batches', flags.evalBatches, 200);
    const port = parsePort(flags.port);
    if (!spec) gptConfig(flags.model); // an unknown model fails before anything starts
    if (!spec && flags.demo && stages > minerCount) throw new NimbleError('invalid', `--stages ${stages} needs at least ${stages} miners`);
    const root = join(resolveDataDir(flags), 'up');
    const say = (event: Record<string, unknown>, human: string): void => emit(flags, event, () => human);
    if (flags.chainRpc || process.env.NIMBLE_CHAIN_RPC) throw new NimbleError('invalid', 'nbcli up runs on the local chain; use orchestrator start --chain-rpc for another one');
    const dataDir = resolveDataDir(flags);
    const t0 = performance.now();
    const chain = await orchestratorChain({ ...flags, chainRpc: undefined }, (line) => say({ event: 'log', message: line }, line));
    const password = process.env.NIMBLE_PASSWORD ?? UP_DEMO_PASSWORD;
    const wallets: { name: string; address: string }[] = [];
    let orch: Awaited<ReturnType<typeof startOrchestrator>>;
    try {
      if (chain) {
        const stake = flags.stake !== undefined ? parseEther(checkNim('--stake', flags.stake)) : (chain.minStake ?? 0n);
        for (let i = 0; i < minerCount; i++) wallets.push(await demoWallet(dataDir, `up-miner-${i + 1}`, password, chain, stake));
        say(
          { event: 'wallets', wallets, stake: formatEther(stake), chainId: chain.client.chainId, ms: Math.round(performance.now() - t0) },
          `local chain ${chain.client.chainId} (${join(dataDir, 'chain')}): demo miners' wallets ${wallets.map((w) => w.name).join(', ')} in ${walletsDir(dataDir)}${stake > 0n ? `, ${showNim(stake)} NIM staked each` : ''}`,
        );
      }
      orch = await startOrchestrator({ dataDir: join(root, 'orchestrator'), walletsDataDir: dataDir, port, chain: chain ?? undefined }).catch((err: unknown) => {
        if ((err as NodeJS.ErrnoException).code === 'EADDRINUSE') throw new NimbleError('conflict', `port ${port} on 127.0.0.1 is taken (another nbcli up or orchestrator?): stop it, or give --port 0 for any free port`);
        throw err;
      });
    } catch (err) {
      await chain?.close?.();
      throw err;
    }
    say({ event: 'orchestrator', url: orch.url, dashboard: `${orch.url}/`, login: orch.loginUrl }, `orchestrator on ${orch.url} (state in ${join(root, 'orchestrator')}; ${chain ? `paying ${showNim(chain.emission ?? 0n)} NIM per epoch` : 'unpaid'})\ndashboard: ${orch.url}/ (operator login: ${orch.loginUrl})`);
    const children: ChildProcess[] = [];
    let stopping = false;
    const stopAll = async (): Promise<void> => {
      stopping = true;
      await Promise.all(
        children.map(
          (c) =>
            new Promise<void>((resolve) => {
              if (c.exitCode !== null || c.signalCode !== null) return resolve();
              c.once('exit', () => resolve());
              c.kill('SIGTERM');
              setTimeout(() => c.kill('SIGKILL'), 10_000).unref();
            }),
        ),
      );
      await orch.close();
    };
    const onSignal = (): void => void stopAll().then(() => process.exit(130));
    process.once('SIGINT', onSignal);
    try {
      mkdirSync(join(root, 'logs'), { recursive: true });
      const threads = Math.max(1, Math.floor(2 / Math.max(1, Math.ceil(minerCount / 2))));
      for (let i = 0; i < minerCount; i++) {
        const name = `miner-${i + 1}`;
        const throttle = THROTTLES[i % THROTTLES.length];
        const [cmd, ...pre] = nbcliArgv();
        // with the chain each miner signs with its demo wallet (in the data dir), else with its own miner key
        const identity = chain ? ['--data-dir', dataDir, '--wallet.name', wallets[i].name] : ['--data-dir', join(root, 'miners', name)];
        const child = spawn(cmd, [...pre, 'miner', 'start', '--orchestrator', orch.url, ...identity, '--name', name, '--threads', String(threads), '--throttle', String(throttle)], {
          stdio: ['ignore', 'pipe', 'pipe'],
          env: minerChildEnv(join(root, 'miners', name), chain ? password : null),
        });
        const log = createWriteStream(join(root, 'logs', `${name}.log`));
        child.stdout!.pipe(log);
        child.stderr!.pipe(log);
        child.once('exit', (code, signal) => {
          if (!stopping) process.stderr.write(`${name} exited (${signal ?? code})\n`);
        });
        // a miner that cannot be started (ENOENT, EACCES) is reported; stopAll copes with it
        child.once('error', (err) => process.stderr.write(`${name} could not start: ${err.message}\n`));
        children.push(child);
        say({ event: 'miner', name, throttle, pid: child.pid }, `started ${name} (throttle ${throttle}, ${threads} thread${threads > 1 ? 's' : ''}, log ${join(root, 'logs', `${name}.log`)})`);
      }
      // the run or job is the demo developer's: its key in the data dir signs it and downloads its checkpoints
      const api = new OrchestratorClient(orch.url, { wallet: developerKey(root) });
      if (!flags.demo) {
        const alive = await waitForMiners(api, minerCount, UP_JOB_MINER_WAIT_MS);
        say({ event: 'serving', url: orch.url, openaiBaseUrl: `${orch.url}/v1`, miners: alive }, bringYourModel(orch.url, alive));
        await waitForSignal();
        return;
      }
      if (spec) await trainUpJob(api, spec, { miners: minerCount, keyDir: root, key: developerKey(root), flags, specFile: flags.job, packed });
      else await trainDemoRun(api, { steps, stages, minerCount, evalBatches, root, model: flags.model, mergeEvery: flags.mergeEvery, chain: chain?.client ?? null, key: developerKey(root) }, flags);
      if (orch.epochs) {
        // the run's last epoch closes when it completes; wait for it to settle
        await orch.settleNow();
        const epochs = (await api.epochs()).epochs.filter((e) => e.status !== 'open');
        const totals = new Map<string, bigint>();
        for (const e of epochs) for (const r of e.rewards) totals.set(r.miner, (totals.get(r.miner) ?? 0n) + BigInt(r.amountWei));
        const named = wallets.map((w) => ({ ...w, earned: formatEther(totals.get(w.address) ?? 0n) }));
        say(
          { event: 'rewards', epochs, miners: named },
          `rewards (staked for the miners):\n${epochs.map(describeEpoch).join('\n')}\ntotal: ${named.map((w) => `${w.name} ${displayNim(w.earned)} NIM`).join(', ')}\n(nbcli rewards, nbcli wallet balance --wallet.name up-miner-1)`,
        );
      }
      if (flags.steps === undefined) {
        say({ event: 'serving', url: orch.url, openaiBaseUrl: `${orch.url}/v1` }, 'the network keeps serving; Ctrl+C stops every process');
        await waitForSignal();
      }
    } catch (err) {
      // Ctrl+C closed the orchestrator under a request in flight: that is the stop, not an error
      if (stopping) await new Promise<never>(() => {});
      throw err;
    } finally {
      process.off('SIGINT', onSignal);
      if (!stopping) await stopAll();
    }
  });
}

/** What the demo run trains. */
interface DemoRun {
  steps: number;
  stages: number;
  minerCount: number;
  evalBatches: number;
  /** <data-dir>/up: where its checkpoint is written */
  root: string;
  model: string;
  mergeEvery?: string;
  /** where the trained model is published (null: unpaid, the model store only) */
  chain: ChainClient | null;
  /** the developer key that owns the run and its model */
  key: Hex;
}

/** up's developer key (<data-dir>/up/developer-key.json, made on first use). */
function developerKey(root: string): Hex {
  return loadOrCreateKeyFile(join(root, DEVELOPER_KEY_FILE)).privateKey;
}

/** The demo run: trains it, writes its checkpoint, prints the held-out loss and a sample. */
async function trainDemoRun(api: OrchestratorClient, o: DemoRun, flags: Flags): Promise<void> {
  const say = (event: Record<string, unknown>, human: string): void => emit(flags, event, () => human);
  const config = gptConfig(o.model);
  const { steps, stages, minerCount, evalBatches, root } = o;
  const run = await api.createRun({
    model: o.model,
    data: 'moby-dick',
    steps,
    stages,
    minMiners: minerCount,
    ...(o.mergeEvery ? { mergeEvery: parsePositiveInt('--merge-every', o.mergeEvery, 50) } : {}),
  });
  say({ event: 'run', id: run.id }, `run ${run.id}: ${o.model} on moby-dick, ${steps} steps of ${run.batchSize}×${config.contextLength} tokens, ${stages} stages`);
  const done = await followRun(api, run.id, Boolean(flags.json));
  if (done.status !== 'completed') throw new Error(`run ${done.id} ${done.status}: ${done.message ?? ''}`);
  const bytes = await api.checkpoint(run.id);
  const ckpt = join(root, `${run.id}.safetensors`);
  writeFileSync(ckpt, bytes);
  const engine = await Engine.create();
  try {
    const model = new GptStage(engine, config, { from: 0, to: partCount(config) }, { batchSize: 12 });
    loadStageFrom(model, decodeSafetensors(bytes));
    const loss = heldoutLoss(model, loadCorpus('moby-dick'), evalBatches, 12);
    const prompt = 'Call me Ishmael. ';
    const sample = prompt + generateCached(engine, bytes, prompt, { maxTokens: 200, temperature: 0.8, seed: 1 }).text;
    say(
      { event: 'done', id: run.id, heldoutLoss: loss, checkpoint: ckpt, sample, tokensDone: done.tokensDone, mergesDone: done.mergesDone, bytesSent: done.bytesSent },
      `${describeRun(done)}\nheld-out loss ${loss.toFixed(4)} nats/byte (${evalBatches} batches)\ncheckpoint: ${ckpt}\nsample:\n${sample}`,
    );
    model.release();
  } finally {
    await engine.close();
  }
  // the trained model, deployed on the miners, and a generation through them
  const served = await serveUpModel(api, {
    checkpoint: bytes, checkpointPath: ckpt, name: `up-${o.model}-${run.id.slice(0, 8)}`, key: o.key, chain: o.chain, stages: Math.min(stages, minerCount),
    prompt: SERVE_PROMPT, maxTokens: 200, say, onText: (text) => !flags.json && process.stdout.write(text),
  });
  say(
    { event: 'served', sha256: served.sha256, deployment: served.deployment.id, prompt: SERVE_PROMPT, text: served.text, ms: Math.round(served.ms) },
    `\n(${served.text.length} characters in ${(served.ms / 1000).toFixed(1)} s through ${served.deployment.stages.length} stage miners; try: nbcli generate --orchestrator ${api.url} --model ${served.deployment.name} --api-key ${served.apiKey} --prompt "…")`,
  );
}

/** The prompt of the generation served through the miners. */
const SERVE_PROMPT = 'Call me Ishmael. ';

/**
 * A demo miner's environment: the allowlist of src/protocol/child-env.ts, its
 * own data folder, and the wallet password only when it signs with a wallet
 * (on the chain); nothing else of this process's environment.
 */
export function minerChildEnv(home: string, password: string | null, parent: NodeJS.ProcessEnv = process.env): NodeJS.ProcessEnv {
  return childEnv({ NIMBLE_HOME: home, NIMBLE_PASSWORD: password ?? undefined }, parent);
}

function checkNim(flag: string, value: string): string {
  if (!/^\d+(\.\d{1,18})?$/.test(value.trim())) throw new NimbleError('invalid', `${flag} must be a non-negative number of NIM, got '${value}'`);
  return value.trim();
}

/** A demo miner's wallet: created if missing, funded with ether for gas and, when asked, NIM staked up to `stake`. */
async function demoWallet(dataDir: string, name: string, password: string, chain: ChainOptions, stake: bigint): Promise<{ name: string; address: string }> {
  let address: string;
  try {
    address = loadWalletFile(dataDir, name).info.address;
  } catch {
    address = saveWallet(dataDir, name, generatePrivateKey(), password, 'light').address; // a throwaway wallet on the local chain
  }
  if (stake > 0n) {
    const { staked } = await readStake(chain.client, address as `0x${string}`);
    if (staked < stake) {
      const { account } = unlockWallet(dataDir, name, password);
      await faucet(chain.client, account.address, stake - staked);
      await addStake(chain.client, signerFor(chain.client, account), stake - staked);
    }
  }
  return { name, address };
}
