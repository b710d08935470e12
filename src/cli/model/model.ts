// nbcli model: publish a trained model (from a job's checkpoint or a file) on
// the chain's ModelRegistry, list and show what is published, and download a
// published model's file from the network's model store, checked against the
// sha256 registered on chain (docs/jobs.md, "Publish"); deploy it on miners
// and undeploy it (./model-deploy.ts, docs/inference.md, "Deploy").
import { join } from 'node:path';
import { Value } from '@sinclair/typebox/value';
import type { Command } from 'commander';
import { OrchestratorClient } from '../../api/client.ts';
import { DeploymentClient } from '../../api/deployment-client.ts';
import type { DeploymentView } from '../../api/deployments.ts';
import { downloadVerified } from '../../api/download.ts';
import { ModelClient } from '../../api/model-client.ts';
import { MetadataUri, ModelName, type StoredModelView } from '../../api/models.ts';
import { formatNim, showNim, parseNim } from '../../chain/amounts.ts';
import type { PublishedModel } from '../../chain/registry.ts';
import { loadWalletFile, unlockWallet } from '../../chain/wallets.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { onChain, parseAddress, withChainOption, type ChainCommandOptions } from '../chain-options.ts';
import { DEFAULT_ORCHESTRATOR, emit, parsePositiveInt, resolveDataDir, withCommonOptions } from '../common.ts';
import { deploymentLines, registerModelDeploy } from './model-deploy.ts';
import { registerModelImport, type PublishFlags } from './model-import.ts';
import { registerModelStore } from './model-store.ts';
import { publish, type ModelSource } from './model-publish.ts';
import { allPublished, publishedJson, publishedLine, resolvePublished } from './model-resolve.ts';
import { ProgressBar } from '../progress.ts';
import { readPassword } from '../prompt.ts';

interface Flags extends ChainCommandOptions {
  orchestrator: string;
  job?: string;
  step?: string;
  file?: string;
  name?: string;
  pricePer1kTokens?: string;
  metadataUri?: string;
  keepDays?: string;
  owner?: string;
  out?: string;
}

export function registerModel(program: Command): void {
  const group = program.command('model').description('publish trained models on the chain, list them, download them checked against the chain');
  const common = (cmd: Command): Command => withChainOption(withCommonOptions(cmd.option('--orchestrator <url>', 'the network', DEFAULT_ORCHESTRATOR)));
  const models = (flags: Flags, wallet?: `0x${string}`): ModelClient => new ModelClient(new OrchestratorClient(flags.orchestrator, wallet ? { wallet } : {}));

  common(
    group
      .command('publish')
      .description("store a job's checkpoint (--job) or a whole-model safetensors file (--file) in the network's model store and publish it on the ModelRegistry")
      .option('--job <id>', 'one of your jobs: its last checkpoint, or the one of --step')
      .option('--step <n>', 'with --job: the checkpoint of this step')
      .option('--file <path>', 'a whole-model checkpoint (safetensors, as nbcli checkpoint download or train --local write)')
      .option('--name <name>', 'the name on the registry (letters, digits, _ . -; up to 64)')
      .option('--price-per-1k-tokens <nim>', 'what serving 1,000 generated tokens (a classifier: 1,000 classifications) costs, in NIM', '0')
      .option('--metadata-uri <uri>', "where the model's metadata is (default: the orchestrator's GET /models/<sha256>)")
      .option('--keep-days <n>', "with --file: store it paid for N days (NIM per GB-day, paid first), as when the network's free store is full")
      .option('--wallet.name <name>', 'the wallet that owns and publishes the model (a file in <data-dir>/wallets/)'),
  ).action(async (flags: Flags) => publishCommand(flags, sourceOf(flags)));
  common(group.command('list').description("the models published on the chain, with the orchestrator's deployments of them").option('--owner <address>', 'only those of this owner')).action(async (flags: Flags) => {
    const owner = flags.owner === undefined ? undefined : parseAddress(flags.owner, '--owner');
    const list = (await onChain(flags, allPublished, { orchestrator: flags.orchestrator, fallback: true })).filter((m) => !owner || m.owner.toLowerCase() === owner.toLowerCase());
    const deployments = await liveDeployments(flags);
    const of = (m: PublishedModel): DeploymentView | null => deployments.get(m.checkpointSha256.slice(2).toLowerCase()) ?? null;
    emit(
      flags,
      list.map((m) => ({ ...publishedJson(m), deployment: of(m) })),
      () => (list.length ? list.map((m) => publishedLine(m) + deploymentSummary(of(m))).join('\n') : 'no model is published yet: nbcli model publish'),
    );
  });

  common(group.command('show <name>').description('a published model (by name or sha256) and, when the orchestrator stores its file, its kind (gpt or mlp classifier), size, config and source').option('--owner <address>', 'the owner, when several published that name')).action(
    async (ref: string, flags: Flags) => {
      const m = await find(flags, ref);
      const stored = await models(flags).get(m.checkpointSha256.slice(2)).catch((err: unknown) => {
        if (err instanceof NimbleError && (err.status === 404 || err.code === 'unreachable')) return null;
        throw err;
      });
      const deployed = stored?.deployment ? deploymentLines(stored.deployment).map((l) => `  ${l}`) : [];
      emit(flags, { ...publishedJson(m), stored }, () => [publishedLine(m), `  metadata ${m.metadataURI}`, storedLine(stored, flags.orchestrator), ...deployed].join('\n'));
    },
  );

  common(
    group
      .command('download <name>')
      .description("download a published model's file (by name or sha256); it is checked against the sha256 on chain, and an interrupted download resumes")
      .option('--owner <address>', 'the owner, when several published that name')
      .option('--out <file>', 'where to write it (default: <data-dir>/models/<name>-<id>.safetensors)'),
  ).action(async (ref: string, flags: Flags) => {
    const r = await downloadPublished(flags, ref, flags.out);
    emit(flags, { event: 'downloaded', id: r.id, name: r.name, path: r.path, bytes: r.bytes, sha256: r.sha256, resumedFrom: r.resumedFrom }, () => `${r.path}: ${r.bytes} bytes, sha256 ${r.sha256} (matches model #${r.id} on chain)${r.resumedFrom ? `, resumed at byte ${r.resumedFrom}` : ''}`);
  });

  registerModelImport(group, common, { publish: publishCommand, download: downloadPublished });
  registerModelDeploy(group, common);
  registerModelStore(group, common);
}

/** Stores `source` in the orchestrator's model store and publishes it on the ModelRegistry from the wallet of --wallet.name (model publish, model import). */
export async function publishCommand(flags: PublishFlags, source: ModelSource): Promise<void> {
  const terms = { name: checkedName(flags.name), pricePer1kTokens: parsePrice(flags.pricePer1kTokens), metadataURI: checkedUri(flags.metadataUri) };
  const dataDir = resolveDataDir(flags);
  const walletName = flags['wallet.name'];
  if (!walletName) throw new NimbleError('invalid', '--wallet.name is required: the wallet that owns and publishes the model');
  loadWalletFile(dataDir, walletName); // an unknown wallet fails before the prompt
  const keepDays = flags.keepDays === undefined ? undefined : parsePositiveInt('--keep-days', flags.keepDays, 1);
  if (keepDays !== undefined && source.kind !== 'file') throw new NimbleError('invalid', '--keep-days is for --file (a job\'s checkpoint is kept with nbcli model keep once stored)');
  const { account, privateKey } = unlockWallet(dataDir, walletName, await readPassword(`Password for wallet '${walletName}': `));
  const r = await onChain(flags, (client) => publish(client, new ModelClient(new OrchestratorClient(flags.orchestrator, { wallet: privateKey })), account, source, terms, keepDays), { orchestrator: flags.orchestrator });
  const m = r.ticket.model;
  emit(
    flags,
    { event: 'published', id: Number(r.id), name: m.name, kind: m.kind, model: m.model, owner: account.address, sha256: m.sha256, bytes: m.bytes, jobId: m.jobId, step: m.step, pricePer1kTokens: formatNim(terms.pricePer1kTokens), metadataURI: r.ticket.attestation.metadataURI, tx: r.tx },
    () => `published ${m.name} (${kindLabel(m)}) as model #${r.id}: sha256 ${m.sha256}, ${m.bytes} bytes, owner ${account.address}, ${showNim(terms.pricePer1kTokens)} NIM / 1k ${m.kind === 'mlp' ? 'classifications' : 'tokens'} (tx ${r.tx})`,
  );
}

/** Downloads a published model's file (by name or sha256), checked against the sha256 on chain; resumes a cut download. */
export async function downloadPublished(flags: ChainCommandOptions & { orchestrator: string; owner?: string; json?: boolean }, ref: string, out: string | undefined): Promise<{ id: number; name: string; path: string; bytes: number; sha256: string; resumedFrom: number }> {
  const m = await find(flags, ref);
  const sha256 = m.checkpointSha256.slice(2);
  const client = new ModelClient(new OrchestratorClient(flags.orchestrator));
  const stored = await client.get(sha256).catch((err: unknown) => {
    if (err instanceof NimbleError && err.status === 404) throw new NimbleError('not_found', `the orchestrator at ${flags.orchestrator} does not store the file of model #${m.id} '${m.name}'`);
    throw err;
  });
  const path = out ?? join(resolveDataDir(flags), 'models', `${m.name}-${m.id}.safetensors`);
  const bar = new ProgressBar('download');
  const started = Date.now();
  const r = await downloadVerified(
    { sha256, bytes: stored.bytes, what: `file of model #${m.id} '${m.name}'`, origin: 'the sha256 registered on chain', open: (offset, signal) => client.openFile(sha256, offset, signal) },
    path,
    (p) => flags.json || bar.update({ done: p.done, total: p.total, elapsedMs: Date.now() - started, text: `bytes${p.resumedFrom ? ` (resumed at ${p.resumedFrom})` : ''}` }),
  );
  return { id: Number(m.id), name: m.name, path: r.path, bytes: r.bytes, sha256: r.sha256, resumedFrom: r.resumedFrom ?? 0 };
}

/** The orchestrator's live deployments by model sha256 (none when it cannot be reached). */
async function liveDeployments(flags: Flags): Promise<Map<string, DeploymentView>> {
  const list = await new DeploymentClient(new OrchestratorClient(flags.orchestrator)).list().catch((err: unknown) => {
    if (err instanceof NimbleError && (err.code === 'unreachable' || err.status === 404)) return [];
    throw err;
  });
  return new Map(list.filter((d) => d.status !== 'undeployed').map((d) => [d.sha256, d]));
}

/** What `model list` adds to a model's line: its live deployment. */
function deploymentSummary(d: DeploymentView | null): string {
  if (!d) return '';
  const miners = d.stages.reduce((n, s) => n + s.miners.length, 0);
  return `  ${d.status} on ${d.stages.length || '?'} stage${d.stages.length === 1 ? '' : 's'}, ${miners} miner${miners === 1 ? '' : 's'} (${d.id})`;
}

function find(flags: ChainCommandOptions & { orchestrator: string; owner?: string }, ref: string): Promise<PublishedModel> {
  const owner = flags.owner === undefined ? undefined : parseAddress(flags.owner, '--owner');
  return onChain(flags, (client) => resolvePublished(client, ref, owner), { orchestrator: flags.orchestrator, fallback: true });
}

function sourceOf(flags: Flags): ModelSource {
  if ((flags.job === undefined) === (flags.file === undefined)) throw new NimbleError('invalid', 'give exactly one of --job ID and --file PATH');
  if (flags.file !== undefined) {
    if (flags.step !== undefined) throw new NimbleError('invalid', '--step goes with --job, not --file');
    return { kind: 'file', path: flags.file };
  }
  return { kind: 'job', job: flags.job!, ...(flags.step === undefined ? {} : { step: parsePositiveInt('--step', flags.step, 0) }) };
}

function checkedName(name: string | undefined): string {
  if (name === undefined) throw new NimbleError('invalid', '--name is required');
  if (!Value.Check(ModelName, name)) throw new NimbleError('invalid', `--name must be letters, digits, _ . - (starting with a letter or digit), up to 64, got '${name}'`);
  return name;
}

function checkedUri(uri: string | undefined): string | undefined {
  if (uri !== undefined && !Value.Check(MetadataUri, uri)) throw new NimbleError('invalid', `--metadata-uri must be printable ASCII without spaces, up to 512 characters`);
  return uri;
}

/** A price in NIM: 0 (free) or a positive amount. */
function parsePrice(value: string | undefined): bigint {
  return value === undefined || /^0*(\.0*)?$/.test(value.trim()) ? 0n : parseNim(value, '--price-per-1k-tokens');
}

/** What `model show` says of the stored file: its size, source, kind, reference and sizes. */
export function storedLine(s: StoredModelView | null, orchestrator: string): string {
  if (!s) return `  the orchestrator at ${orchestrator} does not store its file`;
  const source = s.jobId ? `job ${s.jobId} step ${s.step}` : `uploaded (step ${s.step})`;
  return `  stored at ${orchestrator}: ${s.bytes} bytes, ${source}, ${kindLabel(s)}: ${sizesOf(s.config)}`;
}

/** `gpt gpt-micro`, `mlp classifier mlp:4096-64-2`. */
function kindLabel(s: StoredModelView): string {
  return `${s.kind === 'mlp' ? 'mlp classifier' : 'gpt'} ${s.model}`;
}

/** A config's sizes, of either kind. */
function sizesOf(c: StoredModelView['config']): string {
  if ('inputs' in c) return `${c.inputs} inputs, ${c.hidden.length ? `hidden ${c.hidden.join(', ')}` : 'no hidden layer'}, ${c.classes} classes`;
  return `${c.layers} layers × ${c.channels} channels, context ${c.contextLength}, vocab ${c.vocabSize}`;
}
