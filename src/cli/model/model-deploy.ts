// nbcli model deploy|undeploy: the owner of a published GPT asks the network
// to serve it on miners (docs/inference.md, "Deploy"), or to stop. The model
// is found on the chain's ModelRegistry by name or sha256 (as `model show`
// does); the request is signed with the owner's wallet. `--wait` follows the
// deployment until every stage has a miner serving checked weights.
import type { Command } from 'commander';
import { OrchestratorClient } from '../../api/client.ts';
import { DeploymentClient } from '../../api/deployment-client.ts';
import { MAX_IDLE_LIMIT_MS, MIN_IDLE_LIMIT_MS, type DeploymentView } from '../../api/deployments.ts';
import { ModelClient } from '../../api/model-client.ts';
import { loadWalletFile, unlockWallet } from '../../chain/wallets.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { onChain, parseAddress, type ChainCommandOptions } from '../chain-options.ts';
import { emit, parsePositiveInt, resolveDataDir } from '../common.ts';
import { resolvePublished } from './model-resolve.ts';
import { readPassword } from '../prompt.ts';

interface Flags extends ChainCommandOptions {
  orchestrator: string;
  owner?: string;
  replicas?: string;
  stages?: string;
  idleHours?: string;
  wait?: boolean;
  timeout: string;
}

/** Adds `deploy` and `undeploy` to the `model` command group; `common` adds the shared options. */
export function registerModelDeploy(group: Command, common: (cmd: Command) => Command): void {
  common(
    group
      .command('deploy <name>')
      .description('serve a published GPT (by name or sha256) on miners that serve inference: its owner only')
      .option('--replicas <n>', 'miners per stage', '1')
      .option('--stages <n>', 'cut the model into this many stages (default: the fewest that fit the miners)')
      .option('--idle-hours <h>', 'undeploy it after this long without a request', '24')
      .option('--wait', 'wait until every stage has a miner serving checked weights')
      .option('--timeout <s>', 'with --wait: give up after this many seconds', '600')
      .option('--owner <address>', 'the owner, when several published that name')
      .option('--wallet.name <name>', "the model owner's wallet (a file in <data-dir>/wallets/)"),
  ).action(async (ref: string, flags: Flags) => {
    const replicas = parsePositiveInt('--replicas', flags.replicas, 1);
    const stages = flags.stages === undefined ? undefined : parsePositiveInt('--stages', flags.stages, 1);
    const hours = Number(flags.idleHours ?? '24');
    const idleLimitMs = Math.round(hours * 3_600_000);
    if (!(idleLimitMs >= MIN_IDLE_LIMIT_MS && idleLimitMs <= MAX_IDLE_LIMIT_MS)) throw new NimbleError('invalid', `--idle-hours must be between ${MIN_IDLE_LIMIT_MS / 3_600_000} and ${MAX_IDLE_LIMIT_MS / 3_600_000}, got '${flags.idleHours}'`);
    const { sha256, client } = await resolve(ref, flags);
    let d = await client.deploy(sha256, { replicas, ...(stages === undefined ? {} : { stages }), idleLimitMs });
    // progress (and each miner's reason for refusing a stage) on stderr, or as JSON lines beside the result
    const progress = (line: string): void => void (flags.json ? process.stdout.write(JSON.stringify({ event: 'deploying', line }) + '\n') : process.stderr.write(`${line}\n`));
    if (flags.wait) d = await waitServing(new ModelClient(new OrchestratorClient(flags.orchestrator)), sha256, d, Number(flags.timeout) * 1000, progress, true);
    emit(flags, { event: 'deployed', deployment: d }, () => deploymentLines(d).join('\n'));
  });

  common(
    group
      .command('undeploy <name>')
      .description('stop serving a deployed model (by name or sha256): its owner only; its miners are let go')
      .option('--owner <address>', 'the owner, when several published that name')
      .option('--wallet.name <name>', "the model owner's wallet (a file in <data-dir>/wallets/)"),
  ).action(async (ref: string, flags: Flags) => {
    const { sha256, client } = await resolve(ref, flags);
    const d = await client.undeploy(sha256);
    emit(flags, { event: 'undeployed', deployment: d }, () => deploymentLines(d).join('\n'));
  });
}

/** The model's sha256 on chain, and a client signing with the owner's wallet. */
async function resolve(ref: string, flags: Flags): Promise<{ sha256: string; client: DeploymentClient }> {
  const name = flags['wallet.name'];
  if (!name) throw new NimbleError('invalid', "--wallet.name is required: the model owner's wallet");
  const dataDir = resolveDataDir(flags);
  loadWalletFile(dataDir, name); // an unknown wallet fails before the prompt
  const owner = flags.owner === undefined ? undefined : parseAddress(flags.owner, '--owner');
  const m = await onChain(flags, (chain) => resolvePublished(chain, ref, owner), { orchestrator: flags.orchestrator });
  const { privateKey } = unlockWallet(dataDir, name, await readPassword(`Password for wallet '${name}': `));
  return { sha256: m.checkpointSha256.slice(2), client: new DeploymentClient(new OrchestratorClient(flags.orchestrator, { wallet: privateKey })) };
}

/**
 * Polls the model until its deployment serves (or ends, or the timeout
 * passes), telling `progress` each change, and each miner's reason for
 * refusing a stage once (a miner that cannot check the weights on its chain
 * says why; the timeout's error repeats them). With `once`, a deployment that
 * served and then lost a replica (a miner gone or evicted between two polls)
 * is returned as it stands, deploying again, rather than waited on until a
 * new miner comes: what `nbcli model deploy --wait` promises is that it
 * started serving.
 */
export async function waitServing(models: ModelClient, sha256: string, first: DeploymentView, timeoutMs: number, progress: (line: string) => void, once = false): Promise<DeploymentView> {
  const end = Date.now() + (timeoutMs > 0 ? timeoutMs : 600_000);
  let d = first;
  let said = '';
  // a miner's reasons for refusing a stage (it could not check the weights on its chain, the file did not load...), each said once
  const refusals = new Set<string>();
  for (;;) {
    const line = progressLine(d);
    if (line !== said) progress(line);
    said = line;
    for (const r of d.refused) {
      const refusal = refusalLine(r);
      if (!refusals.has(refusal)) progress(`  ${refusal}`);
      refusals.add(refusal);
    }
    if (d.status !== 'deploying' || (once && d.servingAt !== null)) return d;
    if (Date.now() > end) {
      const why = d.refused.length ? `; ${d.refused.map(refusalLine).join('; ')}` : '';
      throw new NimbleError('timeout', `deployment ${d.id} is not serving after ${Math.round(timeoutMs / 1000)} s: ${line}${why}`, 504);
    }
    await new Promise((r) => setTimeout(r, 500));
    const now = (await models.get(sha256)).deployment;
    if (!now || now.id !== d.id) throw new NimbleError('conflict', `deployment ${d.id} is gone from the orchestrator`);
    d = now;
  }
}

/** A miner's refusal of a stage, in its own words. */
function refusalLine(r: DeploymentView['refused'][number]): string {
  return `refused by ${r.id}: ${r.detail}`;
}

function progressLine(d: DeploymentView): string {
  const stages = d.stages.map((s) => `stage ${s.stage}: ${s.miners.map((m) => m.state).join(', ') || 'no miner'}`).join('; ');
  return `${d.id} ${d.status}${stages ? ` (${stages})` : ''}${d.message ? `: ${d.message}` : ''}`;
}

/** A deployment for people: its status, then a line per stage with its miners. */
export function deploymentLines(d: DeploymentView): string[] {
  const again = d.status === 'deploying' && d.servingAt !== null ? ` (it served from ${new Date(d.servingAt).toISOString()}, then lost a replica)` : '';
  const lines = [`deployment ${d.id} of ${d.name}: ${d.status}${again}${d.undeployReason ? ` (${d.undeployReason})` : ''}, ${d.replicas} replica${d.replicas === 1 ? '' : 's'} per stage${d.registry ? `, registry #${d.registry.modelId} deployed flag ${d.registry.deployed === null ? 'not set yet' : d.registry.deployed}` : ''}`];
  if (d.message) lines.push(`  ${d.message}`);
  for (const s of d.stages) {
    const miners = s.miners.map((m) => `${m.name ?? m.id} ${m.state}${m.verifiedBy ? ` (checked against ${m.verifiedBy === 'chain' ? 'the chain' : 'the sha256 only'})` : ''}${m.alive ? '' : ' [gone]'}`);
    lines.push(`  stage ${s.stage} parts [${s.parts[0]}, ${s.parts[1]}), ${(s.memoryBytes / 1e6).toFixed(1)} MB per replica: ${miners.join(', ') || 'no miner'}`);
  }
  for (const r of d.refused) lines.push(`  ${refusalLine(r)}`);
  return lines;
}
