// nbcli model publish: store a whole-model checkpoint in the network's model
// store (a job's checkpoint, or a file checked here first: a GPT or an MLP
// classifier, src/model/whole-model.ts), receive the
// orchestrator's publish attestation, check that it says what was asked, and
// publish on the ModelRegistry from the developer's own wallet.
import { readFileSync, statSync } from 'node:fs';
import { createHash } from 'node:crypto';
import { getAddress, type Address, type Hex, type PrivateKeyAccount } from 'viem';
import { payStore, type PaidKeep } from '../store-payment.ts';
import type { ModelClient, PublishTermsInput } from '../../api/model-client.ts';
import type { PublishTicket } from '../../api/models.ts';
import { signerFor, type ChainClient } from '../../chain/client.ts';
import { modelOfSha256, publishModel } from '../../chain/registry.ts';
import { ensureGas } from '../../chain/token.ts';
import { sha256OfFile } from '../../api/download.ts';
import { checkWholeModel, checkWholeModelFile } from '../../model/whole-model.ts';
import { NimbleError } from '../../protocol/errors.ts';

/** Largest file sent in one request (the orchestrator's limit, src/orchestrator/models/models.ts); a larger one goes up in chunks (src/orchestrator/models/model-uploads.ts). */
const MAX_FILE_BYTES = 256 << 20;

function sizeOf(path: string): number {
  try {
    return statSync(path).size;
  } catch {
    throw new NimbleError('not_found', `cannot read ${path}`);
  }
}

/** Where the weights come from. */
export type ModelSource = { kind: 'job'; job: string; step?: number } | { kind: 'file'; path: string };

export interface Published {
  id: bigint;
  tx: Hex;
  ticket: PublishTicket;
}

/** Reads and checks a model file before anything is sent. */
export function readModelFile(path: string): Uint8Array {
  let size: number;
  try {
    size = statSync(path).size;
  } catch {
    throw new NimbleError('not_found', `cannot read ${path}`);
  }
  if (size > MAX_FILE_BYTES) throw new NimbleError('too_large', `${path} has ${size} bytes; a published model may have at most ${MAX_FILE_BYTES}`);
  const bytes = new Uint8Array(readFileSync(path));
  try {
    checkWholeModel(bytes);
  } catch (err) {
    throw new NimbleError('invalid', `${path} is not a whole Nimble model checkpoint (a GPT or an MLP classifier): ${(err as Error).message}`);
  }
  return bytes;
}

/** Stores the model, checks the attestation, publishes it from `account`. */
export async function publish(
  client: ChainClient, models: ModelClient, account: PrivateKeyAccount, source: ModelSource, terms: PublishTermsInput, keepDays?: number,
  progress: (done: number, total: number) => void = () => {},
): Promise<Published> {
  let ticket: PublishTicket;
  if (source.kind === 'file' && sizeOf(source.path) > MAX_FILE_BYTES) {
    // a large file (an imported model of gigabytes): checked and hashed streaming, uploaded in chunks
    try {
      await checkWholeModelFile(source.path);
    } catch (err) {
      throw new NimbleError('invalid', `${source.path} is not a whole Nimble model checkpoint: ${(err as Error).message}`);
    }
    const sha256 = await sha256OfFile(source.path);
    await refuseIfPublished(client, sha256);
    const size = sizeOf(source.path);
    ticket = await models.storeLargeFile(source.path, sha256, terms, keepDays ? await paidKeep(client, models, account, size, keepDays) : undefined, progress);
    if (ticket.model.sha256 !== sha256) throw new NimbleError('corrupt', `the orchestrator stored sha256 ${ticket.model.sha256}, this file is ${sha256}`);
  } else if (source.kind === 'file') {
    const bytes = readModelFile(source.path);
    const sha256 = createHash('sha256').update(bytes).digest('hex');
    await refuseIfPublished(client, sha256);
    ticket = await models.storeFile(bytes, terms, keepDays ? await paidKeep(client, models, account, bytes.length, keepDays) : undefined);
    if (ticket.model.sha256 !== sha256) throw new NimbleError('corrupt', `the orchestrator stored sha256 ${ticket.model.sha256}, this file is ${sha256}`);
  } else {
    ticket = await models.storeFromJob(source.job, source.step, terms);
    await refuseIfPublished(client, ticket.model.sha256);
  }
  checkTicket(client, ticket, account.address, terms);
  const a = ticket.attestation;
  await ensureGas(client, account.address);
  const { id, tx } = await publishModel(client, signerFor(client, account), {
    checkpointSha256: a.checkpointSha256 as Hex,
    name: a.name,
    metadataURI: a.metadataURI,
    owner: account.address,
    pricePer1kTokens: BigInt(a.pricePer1kTokens),
    attestation: { deadline: BigInt(a.deadline), signature: a.signature as Hex },
  });
  return { id, tx: tx.hash, ticket };
}

/** Pays the orchestrator's quote for keeping `bytes` `days` (nothing on an unpaid network): the store is then past the free allowance. */
function paidKeep(client: ChainClient, models: ModelClient, account: PrivateKeyAccount, bytes: number, days: number): Promise<PaidKeep> {
  return payStore(client, (b, d) => models.quote(b, d), account, bytes, days);
}

async function refuseIfPublished(client: ChainClient, sha256: string): Promise<void> {
  const m = await modelOfSha256(client, `0x${sha256}`);
  if (m) throw new NimbleError('conflict', `model ${sha256} is already published on chain ${client.chainId} as #${m.id} '${m.name}' by ${m.owner}`);
}

/** The attestation must be for this chain's registry, this owner and exactly these terms, or sending it would only waste gas. */
function checkTicket(client: ChainClient, ticket: PublishTicket, owner: Address, terms: PublishTermsInput): void {
  const a = ticket.attestation;
  if (a.chainId !== client.chainId || getAddress(a.registry) !== getAddress(client.deployment.modelRegistry)) {
    throw new NimbleError(
      'conflict',
      `the orchestrator attests for the registry ${a.registry} on chain ${a.chainId}, this command publishes on ${client.deployment.modelRegistry} on chain ${client.chainId}: use the orchestrator's chain (--chain-rpc, --data-dir)`,
    );
  }
  const wrong: string[] = [];
  if (getAddress(a.owner) !== getAddress(owner)) wrong.push(`owner ${a.owner}`);
  if (a.checkpointSha256 !== `0x${ticket.model.sha256}`) wrong.push(`sha256 ${a.checkpointSha256}`);
  if (a.name !== terms.name) wrong.push(`name '${a.name}'`);
  if (BigInt(a.pricePer1kTokens) !== terms.pricePer1kTokens) wrong.push(`price ${a.pricePer1kTokens}`);
  if (terms.metadataURI !== undefined && a.metadataURI !== terms.metadataURI) wrong.push(`metadata URI ${a.metadataURI}`);
  if (wrong.length) throw new NimbleError('corrupt', `the orchestrator's attestation is not for what was asked: ${wrong.join(', ')}`);
}
