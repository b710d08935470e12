// SwiftShader, Google's software Vulkan driver, for machines without a GPU
// (tests, CI). The npm package @sparticuz/chromium (a dev dependency) ships it
// with a Vulkan loader, unpacked next to its browser in the temp folder. Dawn
// reaches a driver through the Vulkan loader (libvulkan.so.1, found by the
// dynamic linker) and the loader reaches SwiftShader through VK_ICD_FILENAMES;
// both must be in place before Dawn creates a Vulkan instance.
import { chromiumExecutablePath } from './chromium-unpack.ts';
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { constants } from 'node:os';
import { dirname, join } from 'node:path';

/** Where the software driver's files are. */
export interface SwiftShaderFiles {
  /** the Vulkan driver manifest (ICD json) to give VK_ICD_FILENAMES */
  icdJson: string;
  /** the Vulkan loader shipped with it, for machines that have none */
  loader: string;
}

const ICD_JSON = 'vk_swiftshader_icd.json';
const LOADER = 'libvulkan.so.1';
/**
 * glibc's RTLD_NODELETE (Linux): keeps a library mapped after dlclose.
 * Node's os.constants.dlopen does not list it; process.dlopen passes flags
 * through to dlopen(3).
 */
const RTLD_NODELETE = 0x1000;

/**
 * Finds SwiftShader, unpacking it from @sparticuz/chromium the first time.
 * Returns why not as a string when it cannot.
 */
export async function findSwiftShader(): Promise<SwiftShaderFiles | string> {
  if (process.platform !== 'linux') return `SwiftShader from @sparticuz/chromium is for Linux only (this is ${process.platform})`;
  let chromium: typeof import('@sparticuz/chromium');
  try {
    chromium = await import('@sparticuz/chromium');
  } catch (e) {
    return `no software GPU: @sparticuz/chromium (a dev dependency) is not installed (${message(e)})`;
  }
  let dir: string;
  try {
    dir = dirname(await chromiumExecutablePath(chromium.default));
    // executablePath() unpacks nothing when the browser is already in the
    // temp folder: unpack the driver alone if it went missing since
    if (!existsSync(join(dir, ICD_JSON))) {
      const archive = join(dirname(createRequire(import.meta.url).resolve('@sparticuz/chromium')), '..', 'bin', 'swiftshader.tar.br');
      dir = await chromium.inflate(archive);
    }
  } catch (e) {
    return `@sparticuz/chromium could not unpack SwiftShader: ${message(e)}`;
  }
  const files = { icdJson: join(dir, ICD_JSON), loader: join(dir, LOADER) };
  for (const f of [files.icdJson, files.loader]) if (!existsSync(f)) return `SwiftShader is incomplete: ${f} is missing`;
  return files;
}

/** Whether the dynamic linker finds a Vulkan loader by name: the system's (LD_LIBRARY_PATH, ld.so.cache) or one already loaded. */
export function hasVulkanLoader(): boolean {
  return linkerLoads(LOADER, constants.dlopen.RTLD_LAZY);
}

/**
 * Makes the software driver the one the Vulkan loader reports, unless
 * VK_ICD_FILENAMES is already set (the caller's choice wins), and, on a
 * machine without a Vulkan loader, loads the one shipped with SwiftShader
 * into this process for good: Dawn's later dlopen("libvulkan.so.1") then
 * finds it by its soname. Returns what it did, or why it could not.
 */
export function useSwiftShader(files: SwiftShaderFiles): { icdFilenames: string; loader: 'system' | 'swiftshader' } | string {
  process.env.VK_ICD_FILENAMES ??= files.icdJson;
  if (hasVulkanLoader()) return { icdFilenames: process.env.VK_ICD_FILENAMES, loader: 'system' };
  linkerLoads(files.loader, constants.dlopen.RTLD_NOW | RTLD_NODELETE);
  if (!hasVulkanLoader()) return `could not load the Vulkan loader ${files.loader}`;
  return { icdFilenames: process.env.VK_ICD_FILENAMES, loader: 'swiftshader' };
}

/**
 * dlopen through process.dlopen. A plain library is no Node addon, so Node
 * reports "did not self-register" and closes it again: that message means the
 * linker found and loaded it; "cannot open shared object file" means it did not.
 */
function linkerLoads(nameOrPath: string, flags: number): boolean {
  try {
    process.dlopen({ exports: {} }, nameOrPath, flags);
    return true;
  } catch (e) {
    return message(e).includes('did not self-register');
  }
}

function message(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}
