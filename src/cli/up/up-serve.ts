// nbcli up's last act (docs/inference.md, "Serve"): the model the demo run
// trained is published (stored in the model store and, on the chain, put on
// the ModelRegistry by up's developer key), deployed on the same miners, and a
// generation is streamed through them with the OpenAI-compatible API, as any
// user would get it, with an API key of up's developer (the model is free: a
// key and no credit).
import { createHash } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { privateKeyToAccount } from 'viem/accounts';
import type { Hex } from 'viem';
import type { OrchestratorClient } from '../../api/client.ts';
import { streamCompletion } from '../../api/completion-client.ts';
import { CreditClient } from '../../api/credit-client.ts';
import { DeploymentClient } from '../../api/deployment-client.ts';
import type { DeploymentView } from '../../api/deployments.ts';
import { ModelClient } from '../../api/model-client.ts';
import type { ChainClient } from '../../chain/client.ts';
import { modelOfSha256 } from '../../chain/registry.ts';
import { NimbleError } from '../../protocol/errors.ts';
import { deploymentLines, waitServing } from '../model/model-deploy.ts';
import { publish } from '../model/model-publish.ts';

export interface UpServeOptions {
  /** the trained whole-model checkpoint and where it was written */
  checkpoint: Uint8Array;
  checkpointPath: string;
  /** the name to publish it under */
  name: string;
  /** the developer key that owns it */
  key: Hex;
  /** the chain to publish on (null: an unpaid network, the model store only) */
  chain: ChainClient | null;
  stages: number;
  prompt: string;
  maxTokens: number;
  /** the API key generations are paid with (default: a new key of the developer's) */
  apiKey?: string;
  say(event: Record<string, unknown>, human: string): void;
  /** called with each piece of generated text (the terminal) */
  onText(text: string): void;
}

export interface UpServed {
  sha256: string;
  deployment: DeploymentView;
  text: string;
  ms: number;
  /** the API key it generated with */
  apiKey: string;
}

/** Publishes, deploys and generates through the miners. */
export async function serveUpModel(api: OrchestratorClient, o: UpServeOptions): Promise<UpServed> {
  const models = new ModelClient(api);
  const sha256 = createHash('sha256').update(o.checkpoint).digest('hex');
  const terms = { name: o.name, pricePer1kTokens: 0n };
  writeFileSync(o.checkpointPath, o.checkpoint);
  if (o.chain) {
    const onChain = await modelOfSha256(o.chain, `0x${sha256}`);
    if (onChain) o.say({ event: 'published', sha256, id: Number(onChain.id), name: onChain.name }, `model ${sha256.slice(0, 12)}… is already published as #${onChain.id} '${onChain.name}'`);
    else {
      const p = await publish(o.chain, models, privateKeyToAccount(o.key), { kind: 'file', path: o.checkpointPath }, terms);
      o.say({ event: 'published', sha256, id: Number(p.id), name: o.name, tx: p.tx }, `published ${o.name} as model #${p.id} on the ModelRegistry (sha256 ${sha256.slice(0, 12)}…, tx ${p.tx})`);
    }
  } else {
    await models.storeFile(o.checkpoint, terms);
    o.say({ event: 'stored', sha256, name: o.name }, `stored ${o.name} in the model store (sha256 ${sha256.slice(0, 12)}…; no chain, so nothing is published)`);
  }
  const first = await new DeploymentClient(api).deploy(sha256, { stages: o.stages });
  const d = await waitServing(models, sha256, first, 300_000, (line) => o.say({ event: 'deploying', line }, line));
  if (d.status !== 'serving') throw new NimbleError('conflict', `the deployment did not start serving: ${deploymentLines(d).join(' / ')}`);
  o.say({ event: 'deployed', deployment: d }, deploymentLines(d).join('\n'));
  const apiKey = o.apiKey ?? (await new CreditClient(api).createKey('nbcli up')).key;
  o.say({ event: 'generating', prompt: o.prompt }, 'generating through the miners:');
  o.onText(o.prompt);
  const t0 = performance.now();
  const out = await streamCompletion(api.url, { model: sha256, prompt: o.prompt, max_tokens: o.maxTokens, temperature: 0.8, seed: 1 }, o.onText, { apiKey });
  return { sha256, deployment: d, text: out.text, ms: performance.now() - t0, apiKey };
}
