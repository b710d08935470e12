// The ModelRegistry contract: publish a trained checkpoint by its sha256
// (by the orchestrator, or by its owner with the orchestrator's EIP-712
// attestation, signed here by signPublishAttestation), deploy / undeploy it
// for serving, list what is published, find a model by its hash.
import { getAddress, hashTypedData, parseEventLogs, type Address, type Hex, type LocalAccount, type TypedDataDefinition, type TypedDataDomain } from 'viem';
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
  /**
   * The orchestrator's signature (signPublishAttestation) over exactly these
   * fields, the owner and `deadline`: required when the signer is the owner,
   * ignored when it holds ORCHESTRATOR_ROLE.
   */
  attestation?: { deadline: bigint; signature: Hex };
}

/** What an orchestrator attests: `owner` may publish this checkpoint with these fields until `deadline`. */
export interface PublishAttestation {
  checkpointSha256: Hex;
  owner: Address;
  name: string;
  metadataURI: string;
  pricePer1kTokens: bigint;
  /** unix seconds (chain time), inclusive */
  deadline: bigint;
}

/** The EIP-712 domain of the ModelRegistry at `client.deployment.modelRegistry` (as its constructor sets it). */
export function registryDomain(client: Pick<ChainClient, 'chainId' | 'deployment'>): TypedDataDomain {
  return { name: 'Nimble ModelRegistry', version: '1', chainId: client.chainId, verifyingContract: client.deployment.modelRegistry };
}

/** ModelRegistry.PUBLISH_TYPEHASH's type, field for field. */
export const PUBLISH_ATTESTATION_TYPES = {
  PublishAttestation: [
    { name: 'checkpointSha256', type: 'bytes32' },
    { name: 'owner', type: 'address' },
    { name: 'name', type: 'string' },
    { name: 'metadataURI', type: 'string' },
    { name: 'pricePer1kTokens', type: 'uint256' },
    { name: 'deadline', type: 'uint256' },
  ],
} as const;

type AttestationTypedData = TypedDataDefinition<typeof PUBLISH_ATTESTATION_TYPES, 'PublishAttestation'>;

function attestationTypedData(client: Pick<ChainClient, 'chainId' | 'deployment'>, a: PublishAttestation): AttestationTypedData {
  return {
    domain: registryDomain(client),
    types: PUBLISH_ATTESTATION_TYPES,
    primaryType: 'PublishAttestation',
    message: {
      checkpointSha256: a.checkpointSha256,
      owner: getAddress(a.owner),
      name: a.name,
      metadataURI: a.metadataURI,
      pricePer1kTokens: a.pricePer1kTokens,
      deadline: a.deadline,
    },
  };
}

/** The EIP-712 digest of an attestation (what the contract's publishAttestationDigest returns). */
export function publishAttestationDigest(client: Pick<ChainClient, 'chainId' | 'deployment'>, a: PublishAttestation): Hex {
  return hashTypedData(attestationTypedData(client, a));
}

/**
 * Signs `attestation` with `orchestrator` (an account holding the registry's
 * ORCHESTRATOR_ROLE): the signature lets `attestation.owner`, and only that
 * address, publish that checkpoint with those fields until the deadline. The
 * orchestrator signs only for the developer whose job produced the weights or
 * who first stored them in its model store.
 */
export async function signPublishAttestation(
  client: Pick<ChainClient, 'chainId' | 'deployment'>,
  orchestrator: LocalAccount,
  attestation: PublishAttestation,
): Promise<Hex> {
  return orchestrator.signTypedData(attestationTypedData(client, attestation));
}

/**
 * Publishes a checkpoint. The orchestrator may publish for any owner; an owner
 * publishing itself passes `model.attestation` (without it the contract
 * refuses with MissingAttestation, nothing is sent).
 */
export async function publishModel(client: ChainClient, signer: SigningClient, model: PublishModel): Promise<{ id: bigint; tx: SentTx }> {
  const tx = await sendContractTx(client, signer, {
    address: client.deployment.modelRegistry,
    abi: modelRegistryAbi,
    functionName: 'publish',
    args: [
      model.checkpointSha256,
      model.name,
      model.metadataURI,
      model.owner ?? signer.account.address,
      model.pricePer1kTokens,
      model.attestation?.deadline ?? 0n,
      model.attestation?.signature ?? '0x',
    ],
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

/** The model published for this checkpoint hash (0x + 64 hex digits), or null. */
/** The owner of a model name on the registry (the first to publish under it), or null when nobody has it. */
export async function nameOwnerOf(client: ChainClient, name: string): Promise<Address | null> {
  const owner = await client.public.readContract({ address: client.deployment.modelRegistry, abi: modelRegistryAbi, functionName: 'nameOwner', args: [name] });
  return /^0x0{40}$/i.test(owner) ? null : owner;
}

export async function modelOfSha256(client: ChainClient, checkpointSha256: Hex): Promise<PublishedModel | null> {
  const [found, id] = await client.public.readContract({
    address: client.deployment.modelRegistry,
    abi: modelRegistryAbi,
    functionName: 'modelIdOf',
    args: [checkpointSha256],
  });
  if (!found) return null;
  const m = await client.public.readContract({ address: client.deployment.modelRegistry, abi: modelRegistryAbi, functionName: 'getModel', args: [id] });
  return { ...m, id, publishedAt: Number(m.publishedAt) };
}
