// nbcli api-key create|list|revoke (docs/inference.md, "Payment"): keys for
// the OpenAI-compatible POST /v1/completions. A key is bound to the wallet
// that creates it (a signed request) and spends that wallet's credit
// (./credit.ts); the orchestrator keeps only its sha256, so it is shown once.
import type { Command } from 'commander';
import type { ApiKeyView } from '../../api/credits.ts';
import { emit } from '../common.ts';
import { creditClient as client, creditOptions as common, type CreditFlags } from './credit.ts';

export function registerApiKey(program: Command): void {
  const keys = program.command('api-key').description("API keys for the OpenAI-compatible /v1/completions, spending the wallet's credit");
  common(keys.command('create').description('make a key (shown once: keep it)').option('--name <name>', 'a name to tell it by')).action(async (flags: CreditFlags & { name?: string }) => {
    const { credits } = await client(flags);
    const made = await credits.createKey(flags.name);
    emit(flags, made, () => `${made.key}\n(API key ${made.apiKey.id} '${made.apiKey.name}' of ${made.apiKey.owner}: shown this once; use it as the openai client's apiKey or $NIMBLE_API_KEY)`);
  });
  common(keys.command('list').description("the wallet's keys (their first characters; never the keys)")).action(async (flags: CreditFlags) => {
    const list = await (await client(flags)).credits.listKeys();
    emit(flags, { keys: list }, () => (list.length === 0 ? 'no API keys (nbcli api-key create)' : list.map(describeKey).join('\n')));
  });
  common(keys.command('revoke <id>').description('revoke a key: requests with it are refused from now on')).action(async (id: string, flags: CreditFlags) => {
    const k = await (await client(flags)).credits.revokeKey(id);
    emit(flags, k, () => `revoked ${describeKey(k)}`);
  });
}

function describeKey(k: ApiKeyView): string {
  const used = k.lastUsedAt ? `last used ${new Date(k.lastUsedAt).toISOString()}` : 'never used';
  return `${k.id}  ${k.name}  ${k.prefix}…  ${k.revokedAt ? `revoked ${new Date(k.revokedAt).toISOString()}` : used}`;
}
