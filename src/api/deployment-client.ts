// Deploying models through the orchestrator's API (routes in
// src/orchestrator/routes/deployments.ts, contracts in ./deployments.ts):
// deploy and undeploy are signed with the owner's wallet key through the
// OrchestratorClient; the deployments are public.
import type { OrchestratorClient } from './client.ts';
import { DeploymentList, DeploymentView, type DeployRequest } from './deployments.ts';

export class DeploymentClient {
  constructor(private readonly api: OrchestratorClient) {}

  /** Deploys the stored, published model `sha256` (the signer must own it). */
  async deploy(sha256: string, request: DeployRequest = {}): Promise<DeploymentView> {
    return (await this.api.signed()).postJson(`/models/${encodeURIComponent(sha256)}/deploy`, request, DeploymentView, 'deployment');
  }

  /** Undeploys the model's live deployment (the signer must own the model). */
  async undeploy(sha256: string): Promise<DeploymentView> {
    return (await this.api.signed()).postJson(`/models/${encodeURIComponent(sha256)}/undeploy`, {}, DeploymentView, 'deployment');
  }

  /** Every deployment, newest first. */
  list(): Promise<DeploymentView[]> {
    return this.api.http.get('/deployments', DeploymentList, 'deployment list');
  }
}
