// The ModelRegistry contract: publish a trained checkpoint by its sha256,
// deploy / undeploy it for serving, list what is published.
import { parseEventLogs, type Address, type Hex } from 'viem';
import { modelRegistryAbi } from './abis.ts';
import type { ChainClient, SigningClient } from './client.ts';
import { sendContractTx, type SentTx } from './tx.ts';

export interface PublishedModel {
  id: bigint;
  checkpointSha256: Hex;
  name: string;
  metadataURI: string;
  owner: Address;
  /** NIM base units per 1,000 generated tokens */
  pricePer1kTokens: bigint;
  deployed: boolean;
  publishedAt: number;
}

export interface PublishModel {
  checkpointSha256: Hex;
  name: string;
  metadataURI: string;
  /** defaults to the signer */
  owner?: Address;
  pricePer1kTokens: bigint;
}

export async function publishModel(client: ChainClient, signer: SigningClient, model: PublishModel): Promise<{ id: bigint; tx: SentTx }> {
  const tx = await sendContractTx(client, signer, {
    address: client.deployment.modelRegistry,
    abi: modelRegistryAbi,
    functionName: 'publish',
    args: [model.checkpointSha256, model.name, model.metadataURI, model.owner ?? signer.account.address, model.pricePer1kTokens],
  });
  const [event] = parseEventLogs({ abi: modelRegistryAbi, logs: tx.receipt.logs, eventName: 'ModelPublished' });
  if (!event) throw new Error(`publish sent no ModelPublished event (${tx.hash})`);
  return { id: event.args.modelId, tx };
}

export async function setModelDeployed(client: ChainClient, signer: SigningClient, id: bigint, deployed: boolean): Promise<SentTx> {
  return sendContractTx(client, signer, {
    address: client.deployment.modelRegistry,
    abi: modelRegistryAbi,
    functionName: deployed ? 'deploy' : 'undeploy',
    args: [id],
  });
}

export async function listModels(client: ChainClient, offset = 0n, limit = 1000n): Promise<PublishedModel[]> {
  const page = await client.public.readContract({
    address: client.deployment.modelRegistry,
    abi: modelRegistryAbi,
    functionName: 'listModels',
    args: [offset, limit],
  });
  return page.map((m, i) => ({ ...m, id: offset + BigInt(i), publishedAt: Number(m.publishedAt) }));
}
