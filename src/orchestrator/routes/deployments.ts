// Deploying a published model (docs/inference.md, "Deploy"): its owner, and
// only its owner, asks for it to be served (`POST /models/:sha256/deploy`,
// replicas and stages) or for it to stop (`POST /models/:sha256/undeploy`),
// signed with the owner's wallet. On a paid network the owner is the one on
// the ModelRegistry, read on chain, and a model must be published there; on
// an unpaid one (no chain) it is the address that stored it. `GET
// /deployments` lists every deployment; `GET /models` shows each model's.
// Contracts in src/api/deployments.ts; the rules in ../deployments.ts.
import { Type } from '@sinclair/typebox';
import { DeploymentList, DeploymentView, DeployRequest } from '../../api/deployments.ts';
import { Sha256 } from '../../api/models.ts';
import type { HttpServer } from '../../http/server.ts';
import { signerOf } from '../../http/signed.ts';
import { NimbleError } from '../../protocol/errors.ts';
import type { Coordinator } from '../coordinator.ts';
import type { ModelRegistryAccess } from '../deployment-registry.ts';
import { checkDeployable, deploymentView } from '../deployments.ts';
import type { RegistryEntry } from '../state/deployments.ts';
import type { ModelRecord } from '../state/models.ts';

const developer = { signed: 'wallet' } as const;
const Params = Type.Object({ sha256: Sha256 });

/** `registry`: the chain's ModelRegistry (null: an unpaid network). */
export function deploymentRoutes(app: HttpServer, c: Coordinator, registry: ModelRegistryAccess | null): void {
  const stored = (sha256: string): ModelRecord => {
    const m = c.state.models.get(sha256);
    if (!m) throw new NimbleError('not_found', `no stored model ${sha256}`);
    return m;
  };

  /** The model's owner and registry entry; refuses anyone else. */
  const ownerOnly = async (m: ModelRecord, signer: string, what: string): Promise<{ owner: string; entry: RegistryEntry | null }> => {
    let owner = m.owner;
    let entry: RegistryEntry | null = null;
    if (registry) {
      const onChain = await registry.lookup(m.sha256);
      if (!onChain) throw new NimbleError('not_published', `model ${m.sha256} ('${m.name}') is stored but not published on chain ${registry.chainId}: publish it first (nbcli model publish)`, 409);
      owner = onChain.owner;
      entry = { chainId: registry.chainId, address: registry.address, modelId: Number(onChain.id) };
    }
    if (owner.toLowerCase() !== signer.toLowerCase()) {
      const where = entry ? `model #${entry.modelId} '${m.name}' on chain ${entry.chainId}` : `model '${m.name}'`;
      throw new NimbleError('forbidden', `${where} is ${owner}'s: only its owner may ${what} it`);
    }
    return { owner, entry };
  };

  app.post('/models/:sha256/deploy', { config: developer, schema: { params: Params, body: DeployRequest, response: { 200: DeploymentView } } }, async (req) => {
    const m = stored(req.params.sha256);
    checkDeployable(m);
    const { owner, entry } = await ownerOnly(m, signerOf(req), 'deploy');
    const body = req.body ?? {};
    return deploymentView(c.state, c.deployments.deploy({ model: m, owner, registry: entry, replicas: body.replicas, stages: body.stages, idleLimitMs: body.idleLimitMs }));
  });

  app.post('/models/:sha256/undeploy', { config: developer, schema: { params: Params, response: { 200: DeploymentView } } }, async (req) => {
    const m = stored(req.params.sha256);
    await ownerOnly(m, signerOf(req), 'undeploy');
    const live = c.state.deployments.liveOf(m.sha256);
    if (!live) throw new NimbleError('conflict', `model ${m.sha256} ('${m.name}') is not deployed`);
    return deploymentView(c.state, c.deployments.undeploy(live.id, `undeployed by its owner`));
  });

  app.get('/deployments', { schema: { response: { 200: DeploymentList } } }, async () => c.state.deployments.list().map((d) => deploymentView(c.state, d)));
}
