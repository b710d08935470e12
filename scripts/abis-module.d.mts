// Types of scripts/abis-module.mjs for the TypeScript test that imports it.
export declare const ABIS_MODULE: string;
export declare function abiExportName(contractName: string): string;
export declare function renderAbisModule(artifacts: readonly { contractName: string; abi: readonly unknown[] }[]): string;
