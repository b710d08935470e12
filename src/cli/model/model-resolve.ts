// Finding a published model on the chain's ModelRegistry from what a user
// types: its sha256, or its name (optionally of one owner). A name is its
// first publisher's on the ModelRegistry (another owner's publish under it is
// refused, NameTaken); a name several owners published on a registry older
// than that rule is refused as ambiguous (picking one would let an impostor's
// weights be downloaded); one owner's republished name means its newest model.
import type { Address, Hex } from 'viem';
import type { ChainClient } from '../../chain/client.ts';
import { formatNim, showNim } from '../../chain/amounts.ts';
import { listModels, modelOfSha256, type PublishedModel } from '../../chain/registry.ts';
import { NimbleError } from '../../protocol/errors.ts';

const PAGE = 1000n;
const SHA256 = /^(0x)?[0-9a-fA-F]{64}$/;

/** Every published model, in publishing order. */
export async function allPublished(client: ChainClient): Promise<PublishedModel[]> {
  const out: PublishedModel[] = [];
  for (let offset = 0n; ; offset += PAGE) {
    const page = await listModels(client, offset, PAGE);
    out.push(...page);
    if (BigInt(page.length) < PAGE) return out;
  }
}

/** The published model `ref` (a name or a sha256) names, of `owner` when given. */
export async function resolvePublished(client: ChainClient, ref: string, owner?: Address): Promise<PublishedModel> {
  if (SHA256.test(ref)) {
    const sha = `0x${ref.replace(/^0x/, '').toLowerCase()}` as Hex;
    const m = await modelOfSha256(client, sha);
    if (!m) throw new NimbleError('not_found', `no model with sha256 ${sha.slice(2)} is published on chain ${client.chainId}`);
    if (owner && m.owner.toLowerCase() !== owner.toLowerCase()) throw new NimbleError('not_found', `model ${sha.slice(2)} is published by ${m.owner}, not ${owner}`);
    return m;
  }
  const matches = (await allPublished(client)).filter((m) => m.name === ref && (!owner || m.owner.toLowerCase() === owner.toLowerCase()));
  if (matches.length === 0) throw new NimbleError('not_found', `no published model is named '${ref}'${owner ? ` by ${owner}` : ''} on chain ${client.chainId} (nbcli model list shows them)`);
  const owners = new Set(matches.map((m) => m.owner.toLowerCase()));
  if (owners.size > 1) {
    const which = matches.map((m) => `#${m.id} by ${m.owner} (sha256 ${m.checkpointSha256.slice(2, 14)}…)`).join(', ');
    throw new NimbleError('ambiguous', `'${ref}' is published by ${owners.size} owners: ${which}; add --owner ADDRESS or give the sha256`);
  }
  return matches.reduce((a, b) => (b.id > a.id ? b : a));
}

/** A published model as JSON (amounts as decimal NIM strings, the hash without 0x). */
export function publishedJson(m: PublishedModel): Record<string, unknown> {
  return {
    id: Number(m.id),
    name: m.name,
    owner: m.owner,
    sha256: m.checkpointSha256.slice(2),
    metadataURI: m.metadataURI,
    pricePer1kTokens: formatNim(m.pricePer1kTokens),
    deployed: m.deployed,
    publishedAt: new Date(m.publishedAt * 1000).toISOString(),
  };
}

/** One line per published model. */
export function publishedLine(m: PublishedModel): string {
  return `#${m.id}  ${m.name}  by ${m.owner}  ${showNim(m.pricePer1kTokens)} NIM / 1k tokens  sha256 ${m.checkpointSha256.slice(2)}  ${new Date(m.publishedAt * 1000).toISOString()}${m.deployed ? '  deployed' : ''}`;
}
