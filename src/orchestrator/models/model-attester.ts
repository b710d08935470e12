// The orchestrator's half of publishing a model on chain: an EIP-712
// attestation, signed with its ORCHESTRATOR_ROLE key, that lets one owner, and
// only that owner, publish one checkpoint sha256 with these fields on the
// ModelRegistry until a deadline (docs/chain.md, "Model registry"). Whom it
// signs for is the model store's rule (./models.ts).
import type { Address, Hex, LocalAccount } from 'viem';
import { signPublishAttestation, type PublishAttestation } from '../../chain/registry.ts';
import { NimbleError } from '../../protocol/errors.ts';
import type { ChainOptions } from '../rewards/epochs.ts';

/** How long an attestation stays valid (chain seconds): publishing follows it at once. */
export const ATTESTATION_TTL_SECONDS = 3600n;

/** A signed attestation and where it is valid. */
export interface SignedAttestation extends PublishAttestation {
  chainId: number;
  registry: Address;
  /** the orchestrator account that signed it */
  signer: Address;
  signature: Hex;
}

export interface ModelAttester {
  attest(fields: Omit<PublishAttestation, 'deadline'>): Promise<SignedAttestation>;
}

/** Attests with the orchestrator's chain signer; the deadline is the chain's time plus ATTESTATION_TTL_SECONDS. */
export function chainAttester(chain: Pick<ChainOptions, 'client' | 'signer'>): ModelAttester {
  const { client, signer } = chain;
  const account = signer.account;
  return {
    async attest(fields) {
      if (account.type !== 'local') throw new NimbleError('internal', `the orchestrator's chain account ${account.address} cannot sign attestations here (not a local key)`);
      const block = await client.public.getBlock({ blockTag: 'latest' }).catch((err: unknown) => {
        throw new NimbleError('unreachable', `cannot read the chain's time at ${client.rpcUrl}: ${(err as Error).message.split('\n')[0]}`, 502, { cause: err });
      });
      const attestation: PublishAttestation = { ...fields, deadline: block.timestamp + ATTESTATION_TTL_SECONDS };
      const signature = await signPublishAttestation(client, account as LocalAccount, attestation);
      return { ...attestation, chainId: client.chainId, registry: client.deployment.modelRegistry, signer: account.address, signature };
    },
  };
}
