// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";
import {NIM} from "./NIM.sol";
import {Staking} from "./Staking.sol";

/// @title RewardDistributor: the orchestrator pays each epoch's rewards once.
/// @notice An epoch is posted in `batchCount` batches, in order; the first
/// batch fixes the batch count and a digest of the full reward list. When the
/// last batch is in, the epoch is settled and can never be posted again.
/// Rewards are minted and credited as stake (the default) or paid to wallets.
contract RewardDistributor is AccessControl {
    bytes32 public constant ORCHESTRATOR_ROLE = keccak256("ORCHESTRATOR_ROLE");

    struct Epoch {
        uint32 batchCount;
        uint32 batchesPosted;
        uint64 settledAt;
        uint128 total;
        bytes32 digest;
    }

    NIM public immutable token;
    Staking public immutable staking;
    mapping(uint256 => Epoch) private _epochs;
    uint256 public totalDistributed;

    event Rewarded(uint256 indexed epochId, address indexed miner, uint256 amount);
    event EpochBatchPosted(uint256 indexed epochId, uint32 batchIndex, uint32 batchCount, uint256 miners, uint256 total);
    event EpochSettled(uint256 indexed epochId, uint32 batchCount, uint256 total, bytes32 digest);

    error EpochAlreadySettled(uint256 epochId);
    error WrongBatch(uint256 epochId, uint32 expected, uint32 got);
    error BatchCountMismatch(uint32 expected, uint32 got);
    error DigestMismatch(bytes32 expected, bytes32 got);
    error InvalidBatchCount();
    error LengthMismatch();
    error ZeroAddress();

    constructor(NIM token_, Staking staking_, address admin, address orchestrator) {
        token = token_;
        staking = staking_;
        _grantRole(DEFAULT_ADMIN_ROLE, admin);
        _grantRole(ORCHESTRATOR_ROLE, orchestrator);
    }

    function epoch(uint256 epochId) external view returns (Epoch memory) {
        return _epochs[epochId];
    }

    function isSettled(uint256 epochId) external view returns (bool) {
        return _epochs[epochId].settledAt != 0;
    }

    /// Posts batch `batchIndex` (0-based) of `batchCount` for `epochId`.
    function postRewards(
        uint256 epochId,
        uint32 batchIndex,
        uint32 batchCount,
        bytes32 digest,
        address[] calldata miners,
        uint256[] calldata amounts,
        bool asStake
    ) external onlyRole(ORCHESTRATOR_ROLE) {
        if (miners.length != amounts.length) revert LengthMismatch();
        Epoch memory e = _epochs[epochId];
        if (e.settledAt != 0) revert EpochAlreadySettled(epochId);
        if (batchIndex != e.batchesPosted) revert WrongBatch(epochId, e.batchesPosted, batchIndex);
        if (batchIndex == 0) {
            if (batchCount == 0) revert InvalidBatchCount();
            e.batchCount = batchCount;
            e.digest = digest;
        } else {
            if (batchCount != e.batchCount) revert BatchCountMismatch(e.batchCount, batchCount);
            if (digest != e.digest) revert DigestMismatch(e.digest, digest);
        }

        uint256 sum = _announce(epochId, miners, amounts);
        if (asStake) {
            token.mint(address(staking), sum);
            staking.creditStakes(miners, amounts, sum);
        } else {
            for (uint256 i = 0; i < miners.length; ++i) token.mint(miners[i], amounts[i]);
        }

        e.batchesPosted = batchIndex + 1;
        e.total += SafeCast.toUint128(sum);
        if (e.batchesPosted == e.batchCount) e.settledAt = uint64(block.timestamp);
        _epochs[epochId] = e;
        totalDistributed += sum;
        emit EpochBatchPosted(epochId, batchIndex, e.batchCount, miners.length, sum);
        if (e.settledAt != 0) emit EpochSettled(epochId, e.batchCount, e.total, e.digest);
    }

    /// Emits one Rewarded event per miner and returns the batch total.
    function _announce(uint256 epochId, address[] calldata miners, uint256[] calldata amounts)
        private
        returns (uint256 sum)
    {
        for (uint256 i = 0; i < miners.length; ++i) {
            address miner = miners[i];
            if (miner == address(0)) revert ZeroAddress();
            uint256 a = amounts[i];
            sum += a;
            emit Rewarded(epochId, miner, a);
        }
    }
}
