// Opens a WebGPU device through Dawn (the `webgpu` npm package), on a real
// GPU or, when asked, on SwiftShader (a software Vulkan driver, for tests).
// Dawn is loaded with a dynamic import on the first call, so that processes
// that never use the GPU never load its 21 MB native module.
import type { create as CreateGpu } from 'webgpu';
import { findSwiftShader, hasVulkanLoader, useSwiftShader } from './swiftshader.ts';
import { recorderOf } from './recorder.ts';

/**
 * Software adapters: 'never' (the default: a miner must not do real work on
 * a CPU pretending to be a GPU), 'allow' (a GPU if there is one, else
 * SwiftShader) or 'only' (SwiftShader: tests that must run everywhere).
 */
export type SoftwarePolicy = 'allow' | 'only' | 'never';

export interface OpenGpuOptions {
  software?: SoftwarePolicy;
  powerPreference?: GPUPowerPreference;
}

/** What the adapter says it is (GPUAdapterInfo, copied). */
export interface AdapterFacts {
  vendor: string;
  architecture: string;
  device: string;
  description: string;
  isFallbackAdapter: boolean;
}

/** The device limits a kernel needs to plan its work (requested at the adapter's maximum). */
export interface GpuLimits {
  maxBufferSize: number;
  maxStorageBufferBindingSize: number;
  maxStorageBuffersPerShaderStage: number;
  maxComputeWorkgroupStorageSize: number;
  maxComputeInvocationsPerWorkgroup: number;
  maxComputeWorkgroupsPerDimension: number;
}

/** An open device. Call close() when done. */
export interface Gpu {
  device: GPUDevice;
  /** a readable name: the adapter's description, else vendor and architecture */
  adapterName: string;
  adapter: AdapterFacts;
  /** a CPU implementation (SwiftShader, llvmpipe...): right answers, meaningless speed */
  isSoftware: boolean;
  limits: GpuLimits;
  /** Errors the device reported outside an error scope since the last call (validation, out of memory). */
  takeErrors(): string[];
  /**
   * Waits for submitted work, destroys the device (freeing its memory now,
   * not at garbage collection) and drops the reference to Dawn's instance.
   * Dawn keeps the process alive only while work is queued, so a process
   * exits by itself even without close() (checked with webgpu 0.6.2).
   */
  close(): Promise<void>;
}

/** A device, or why there is none. */
export type GpuOpening = { gpu: Gpu; reason?: undefined } | { gpu: null; reason: string };

const LIMIT_NAMES = [
  'maxBufferSize',
  'maxStorageBufferBindingSize',
  'maxStorageBuffersPerShaderStage',
  'maxComputeWorkgroupStorageSize',
  'maxComputeInvocationsPerWorkgroup',
  'maxComputeWorkgroupsPerDimension',
] as const;

/**
 * Dawn toggles for every instance. disable_workgroup_init: WebGPU zeroes
 * workgroup memory before each workgroup runs, so that a shader cannot read
 * what another left there; SwiftShader compiles that zeroing into seconds of
 * pipeline creation (2 s for the 8 KiB of the SGEMM tiles, 0.1 s without).
 * The engine runs only its own shaders, and every one of them must write each
 * workgroup cell before reading it.
 */
const DAWN_FLAGS = ['enable-dawn-features=disable_workgroup_init'];

const SOFTWARE_NAMES = /swiftshader|llvmpipe|lavapipe|softpipe/i;

let dawn: Promise<typeof CreateGpu> | undefined;

/**
 * Opens a device under the given software policy. Never throws for a missing
 * GPU: the answer says why there is none. With software allowed, sets
 * VK_ICD_FILENAMES to SwiftShader's manifest (only if it is unset) before
 * Dawn looks for Vulkan drivers; with 'allow', a real GPU is tried first.
 */
export async function openGpu(options: OpenGpuOptions = {}): Promise<GpuOpening> {
  const policy = options.software ?? 'never';
  const why: string[] = [];
  // on Linux without a Vulkan loader there is no GPU to try: Dawn would only warn
  const hardwarePossible = process.platform !== 'linux' || hasVulkanLoader();
  if (policy !== 'only') {
    const found = hardwarePossible ? await tryAdapter(options, false) : 'no Vulkan loader (libvulkan.so.1) on this machine, so no GPU driver';
    if (typeof found === 'string') why.push(found);
    else if (!isSoftware(found.info) || policy === 'allow') return { gpu: await openDevice(found) };
    else why.push(`the only adapter is a software one (${nameOf(found.info)})`);
    if (policy === 'never') return { gpu: null, reason: `${why.join('; ')}; software adapters were not allowed` };
  }
  const files = await findSwiftShader();
  if (typeof files === 'string') return { gpu: null, reason: [...why, files].join('; ') };
  const used = useSwiftShader(files);
  if (typeof used === 'string') return { gpu: null, reason: [...why, used].join('; ') };
  const found = await tryAdapter(options, true);
  if (typeof found === 'string') return { gpu: null, reason: [...why, `with VK_ICD_FILENAMES=${used.icdFilenames}: ${found}`].join('; ') };
  if (policy === 'only' && !isSoftware(found.info)) {
    return { gpu: null, reason: `software only was asked, but VK_ICD_FILENAMES=${used.icdFilenames} gives the hardware adapter ${nameOf(found.info)}` };
  }
  return { gpu: await openDevice(found) };
}

interface FoundAdapter {
  gpu: GPU;
  adapter: GPUAdapter;
  info: GPUAdapterInfo;
}

/** Asks a fresh Dawn instance for an adapter (the Vulkan loader reads its environment anew for each). */
async function tryAdapter(options: OpenGpuOptions, software: boolean): Promise<FoundAdapter | string> {
  let create: typeof CreateGpu;
  try {
    dawn ??= import('webgpu').then((m) => m.create);
    create = await dawn;
  } catch (e) {
    dawn = undefined;
    return `the webgpu package (Dawn) could not be loaded: ${e instanceof Error ? e.message : String(e)}`;
  }
  const gpu = create(DAWN_FLAGS);
  const adapter = await gpu.requestAdapter({ powerPreference: options.powerPreference, forceFallbackAdapter: software });
  if (!adapter) return software ? 'Dawn found no software adapter' : 'Dawn found no GPU adapter';
  return { gpu, adapter, info: adapter.info };
}

async function openDevice(found: FoundAdapter): Promise<Gpu> {
  const requiredLimits: Record<string, number> = {};
  for (const name of LIMIT_NAMES) requiredLimits[name] = found.adapter.limits[name];
  const device = await found.adapter.requestDevice({ requiredLimits, label: 'nimble engine' });
  const limits = {} as GpuLimits;
  for (const name of LIMIT_NAMES) limits[name] = device.limits[name];
  const errors: string[] = [];
  device.onuncapturederror = (event: GPUUncapturedErrorEvent): void => void errors.push(event.error.message);
  let dawnGpu: GPU | undefined = found.gpu; // Dawn's instance lives as long as this reference
  const info = found.info;
  return {
    device,
    adapterName: nameOf(info),
    adapter: { vendor: info.vendor, architecture: info.architecture, device: info.device, description: info.description, isFallbackAdapter: info.isFallbackAdapter },
    isSoftware: isSoftware(info),
    limits,
    takeErrors: (): string[] => errors.splice(0),
    async close(): Promise<void> {
      if (!dawnGpu) return;
      await recorderOf(device).drain();
      device.onuncapturederror = null;
      device.destroy();
      dawnGpu = undefined;
    },
  };
}

function isSoftware(info: GPUAdapterInfo): boolean {
  return info.isFallbackAdapter || SOFTWARE_NAMES.test(`${info.architecture} ${info.device} ${info.description}`);
}

function nameOf(info: GPUAdapterInfo): string {
  return info.description || [info.vendor, info.architecture, info.device].filter(Boolean).join(' ') || 'unnamed adapter';
}
