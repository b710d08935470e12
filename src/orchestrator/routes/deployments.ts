// Deploying a published model (docs/inference.md, "Deploy"): its owner, and
// only its owner, asks for it to be served (`POST /models/:sha256/deploy`,
// replicas and stages) or for it to stop (`POST /models/:sha256/undeploy`),
// signed with the owner's wallet. On a paid network the owner is the one on
// the ModelRegistry, read on chain, and a model must be published there; on
// an unpaid one (no chain) it is the address that stored it. `GET
// /deployments` lists every deployment; `GET /models` shows each model's.
// The operator deploys and undeploys from the dashboard (./dashboard.ts)
// through the OperatorDeployments this returns: the same deployment, with the
// same owner (who is paid the owner's share), only the authority differs.
// Contracts in src/api/deployments.ts; the rules in ../models/deployments.ts.
import { Type } from '@sinclair/typebox';
import { DeploymentList, DeploymentView, DeployRequest } from '../../api/deployments.ts';
import { Sha256 } from '../../api/models.ts';
import type { HttpServer } from '../../http/server.ts';
import { signerOf } from '../../http/signed.ts';
import { NimbleError } from '../../protocol/errors.ts';
import type { Coordinator } from '../training/coordinator.ts';
import { checkDeployRate, type ModelRegistryAccess } from '../models/deployment-registry.ts';
import { checkDeployable, deploymentView } from '../models/deployments.ts';
import type { RegistryEntry } from '../state/deployments.ts';
import type { ModelRecord } from '../state/models.ts';
import type { BuildProbes } from '../serving/build-probe.ts';

const developer = { signed: 'wallet' } as const;
const Params = Type.Object({ sha256: Sha256 });

/** Deploy and undeploy by the orchestrator's operator (the dashboard's buttons): any stored model (published, on a paid network), any deployment. */
export interface OperatorDeployments {
  deploy(sha256: string, request: DeployRequest): Promise<DeploymentView>;
  undeploy(sha256: string): DeploymentView;
}

/** `registry`: the chain's ModelRegistry (null: an unpaid network); `probes`: the cross-build probe a model passes first (null: none). */
export function deploymentRoutes(app: HttpServer, c: Coordinator, registry: ModelRegistryAccess | null, probes: BuildProbes | null = null): OperatorDeployments {
  const stored = (sha256: string): ModelRecord => {
    const m = c.state.models.get(sha256);
    if (!m) throw new NimbleError('not_found', `no stored model ${sha256}`);
    return m;
  };

  /** The model's owner and registry entry (on a paid network, as the chain has them). */
  const ownerOf = async (m: ModelRecord): Promise<{ owner: string; entry: RegistryEntry | null }> => {
    let owner = m.owner;
    let entry: RegistryEntry | null = null;
    if (registry) {
      const onChain = await registry.lookup(m.sha256);
      if (!onChain) throw new NimbleError('not_published', `model ${m.sha256} ('${m.name}') is stored but not published on chain ${registry.chainId}: publish it first (nbcli model publish)`, 409);
      owner = onChain.owner;
      entry = { chainId: registry.chainId, address: registry.address, modelId: Number(onChain.id) };
    }
    return { owner, entry };
  };

  /** The model's owner and registry entry; refuses anyone else. */
  const ownerOnly = async (m: ModelRecord, signer: string, what: string): Promise<{ owner: string; entry: RegistryEntry | null }> => {
    const { owner, entry } = await ownerOf(m);
    if (owner.toLowerCase() !== signer.toLowerCase()) {
      const where = entry ? `model #${entry.modelId} '${m.name}' on chain ${entry.chainId}` : `model '${m.name}'`;
      throw new NimbleError('forbidden', `${where} is ${owner}'s: only its owner may ${what} it`);
    }
    return { owner, entry };
  };

  // a model whose two kernel builds answer too far apart for any check to tell an honest miner from a cheat is refused
  const deploy = async (m: ModelRecord, owner: { owner: string; entry: RegistryEntry | null }, body: DeployRequest): Promise<DeploymentView> => {
    const live = c.state.deployments.liveOf(m.sha256);
    if (!live) await probes?.checkDeployable(m.sha256, m.name);
    return deploymentView(c.state, c.deployments.deploy({ model: m, owner: owner.owner, registry: owner.entry, replicas: body.replicas, stages: body.stages, idleLimitMs: body.idleLimitMs }));
  };
  const undeploy = (m: ModelRecord, by: string): DeploymentView => {
    const live = c.state.deployments.liveOf(m.sha256);
    if (!live) throw new NimbleError('conflict', `model ${m.sha256} ('${m.name}') is not deployed`);
    return deploymentView(c.state, c.deployments.undeploy(live.id, `undeployed by ${by}`));
  };

  app.post('/models/:sha256/deploy', { config: developer, schema: { params: Params, body: DeployRequest, response: { 200: DeploymentView } } }, async (req) => {
    const m = stored(req.params.sha256);
    checkDeployable(m);
    const owner = await ownerOnly(m, signerOf(req), 'deploy');
    // the orchestrator pays the registry's transactions of each deploy and undeploy: an owner deploys a few times an hour
    if (registry) checkDeployRate(c.state, owner.owner, Date.now());
    return deploy(m, owner, req.body ?? {});
  });

  app.post('/models/:sha256/undeploy', { config: developer, schema: { params: Params, response: { 200: DeploymentView } } }, async (req) => {
    const m = stored(req.params.sha256);
    await ownerOnly(m, signerOf(req), 'undeploy');
    return undeploy(m, 'its owner');
  });

  app.get('/deployments', { schema: { response: { 200: DeploymentList } } }, async () => c.state.deployments.list().map((d) => deploymentView(c.state, d)));

  return {
    async deploy(sha256: string, request: DeployRequest): Promise<DeploymentView> {
      const m = stored(sha256);
      checkDeployable(m);
      return deploy(m, await ownerOf(m), request);
    },
    undeploy: (sha256: string): DeploymentView => undeploy(stored(sha256), 'the operator (dashboard)'),
  };
}
