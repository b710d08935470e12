// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";
import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {NIM} from "./NIM.sol";
import {Staking} from "./Staking.sol";

/// @title JobEscrow: a developer's training job is paid from NIM held here.
/// @notice The developer opens one escrow per job id (approve, then open); the
/// orchestrator pays the job's miners from it once per (job, epoch), as stake
/// the way the RewardDistributor pays epoch rewards; the orchestrator closes it
/// (the rest goes back to the developer), or the developer does after
/// `refundAfter` if the orchestrator is gone.
/// While the escrow pays for work (a job accepted, a wallet's inference
/// credit), the orchestrator holds a lock on it (`lock`, renewed as it goes):
/// its owner cannot close it before `lockedUntil`, so work done is never left
/// unpaid by an owner's refund. The orchestrator's own close releases it; an
/// orchestrator that vanished stops renewing, and the lock lapses by itself
/// `lockTimeout` after its last renewal, so NIM is never locked for good.
/// Invariant: token.balanceOf(this) == totalHeld == Σ (amount - paid) over open escrows.
contract JobEscrow is AccessControl {
    using SafeERC20 for IERC20;

    bytes32 public constant ORCHESTRATOR_ROLE = keccak256("ORCHESTRATOR_ROLE");

    struct Escrow {
        address owner;
        /// unix seconds from which the owner may close the escrow itself
        uint64 refundAfter;
        bool closed;
        /// unix seconds until which the orchestrator holds it: its owner may not close it before (0: never locked)
        uint64 lockedUntil;
        uint256 amount;
        uint256 paid;
        uint256 refunded;
    }

    NIM public immutable token;
    Staking public immutable staking;
    /// seconds between open and the owner's own refund
    uint64 public immutable refundDelay;
    /// seconds a lock holds from the orchestrator's last `lock` of an escrow
    uint64 public immutable lockTimeout;
    mapping(bytes32 => Escrow) private _escrows;
    /// job id => epoch => keccak256(abi.encode(miners, amounts)) of its payment (0: not paid)
    mapping(bytes32 => mapping(uint64 => bytes32)) private _paidDigest;
    /// NIM held for open escrows
    uint256 public totalHeld;

    event Opened(bytes32 indexed jobId, address indexed owner, uint256 amount, uint64 refundAfter);
    event Paid(bytes32 indexed jobId, uint64 indexed epoch, address indexed miner, uint256 amount);
    event EpochPaid(bytes32 indexed jobId, uint64 indexed epoch, uint256 miners, uint256 total, bytes32 digest);
    event Closed(bytes32 indexed jobId, address indexed by, uint256 refunded);
    event Locked(bytes32 indexed jobId, uint64 lockedUntil);

    error ZeroJobId();
    error ZeroAmount();
    error ZeroAddress();
    error LengthMismatch();
    error EmptyPayment();
    error JobExists(bytes32 jobId, address owner);
    error UnknownJob(bytes32 jobId);
    error JobClosed(bytes32 jobId);
    error EpochAlreadyPaid(bytes32 jobId, uint64 epoch, bytes32 digest);
    error InsufficientEscrow(bytes32 jobId, uint256 remaining, uint256 requested);
    error RefundNotYet(bytes32 jobId, uint64 refundAfter);
    error EscrowLocked(bytes32 jobId, uint64 lockedUntil);
    error NotAllowed(address caller);

    constructor(NIM token_, Staking staking_, address admin, address orchestrator, uint64 refundDelay_, uint64 lockTimeout_) {
        token = token_;
        staking = staking_;
        refundDelay = refundDelay_;
        lockTimeout = lockTimeout_;
        _grantRole(DEFAULT_ADMIN_ROLE, admin);
        _grantRole(ORCHESTRATOR_ROLE, orchestrator);
    }

    function escrowOf(bytes32 jobId) external view returns (Escrow memory) {
        return _escrows[jobId];
    }

    /// The digest of what job `jobId` paid for `epoch` (0 when it paid nothing for it).
    function paidDigestOf(bytes32 jobId, uint64 epoch) external view returns (bytes32) {
        return _paidDigest[jobId][epoch];
    }

    /// Escrows `amount` of the caller's NIM for job `jobId` (needs an ERC-20 approval first).
    function open(bytes32 jobId, uint256 amount) external {
        if (jobId == bytes32(0)) revert ZeroJobId();
        if (amount == 0) revert ZeroAmount();
        Escrow storage e = _escrows[jobId];
        if (e.owner != address(0)) revert JobExists(jobId, e.owner);
        uint64 refundAfter = uint64(block.timestamp) + refundDelay;
        e.owner = msg.sender;
        e.refundAfter = refundAfter;
        e.amount = amount;
        totalHeld += amount;
        IERC20(address(token)).safeTransferFrom(msg.sender, address(this), amount);
        emit Opened(jobId, msg.sender, amount, refundAfter);
    }

    /// Pays `miners` their `amounts` for their work on job `jobId` in `epoch`,
    /// credited as stake. Once per (job, epoch): a second call reverts with
    /// EpochAlreadyPaid (and the digest of the first). Orchestrator only.
    function pay(bytes32 jobId, uint64 epoch, address[] calldata miners, uint256[] calldata amounts)
        external
        onlyRole(ORCHESTRATOR_ROLE)
    {
        uint256 n = miners.length;
        if (n != amounts.length) revert LengthMismatch();
        if (n == 0) revert EmptyPayment();
        Escrow storage e = _escrows[jobId];
        if (e.owner == address(0)) revert UnknownJob(jobId);
        if (e.closed) revert JobClosed(jobId);
        bytes32 done = _paidDigest[jobId][epoch];
        if (done != bytes32(0)) revert EpochAlreadyPaid(jobId, epoch, done);

        uint256 sum = 0;
        for (uint256 i = 0; i < n; ++i) {
            address miner = miners[i];
            if (miner == address(0)) revert ZeroAddress();
            uint256 a = amounts[i];
            sum += a;
            emit Paid(jobId, epoch, miner, a);
        }
        uint256 remaining = e.amount - e.paid;
        if (sum > remaining) revert InsufficientEscrow(jobId, remaining, sum);
        bytes32 digest = keccak256(abi.encode(miners, amounts));
        _paidDigest[jobId][epoch] = digest;
        e.paid += sum;
        totalHeld -= sum;
        IERC20(address(token)).safeTransfer(address(staking), sum);
        staking.creditStakes(miners, amounts, sum);
        emit EpochPaid(jobId, epoch, n, sum, digest);
    }

    /// Locks job `jobId`'s escrow until `lockTimeout` from now (a later call
    /// renews it): until then its owner cannot close it. Orchestrator only, on
    /// an open escrow. Returns the new `lockedUntil`.
    function lock(bytes32 jobId) external onlyRole(ORCHESTRATOR_ROLE) returns (uint64 lockedUntil) {
        Escrow storage e = _escrows[jobId];
        if (e.owner == address(0)) revert UnknownJob(jobId);
        if (e.closed) revert JobClosed(jobId);
        lockedUntil = uint64(block.timestamp) + lockTimeout;
        if (lockedUntil < e.lockedUntil) lockedUntil = e.lockedUntil;
        e.lockedUntil = lockedUntil;
        emit Locked(jobId, lockedUntil);
    }

    /// Closes job `jobId` and sends what was not paid back to its owner. The
    /// orchestrator may close at any time (which ends its lock); the owner from
    /// `refundAfter` on, and not while the orchestrator's lock holds. Once.
    function close(bytes32 jobId) external returns (uint256 refunded) {
        Escrow storage e = _escrows[jobId];
        address owner = e.owner;
        if (owner == address(0)) revert UnknownJob(jobId);
        if (e.closed) revert JobClosed(jobId);
        if (!hasRole(ORCHESTRATOR_ROLE, msg.sender)) {
            if (msg.sender != owner) revert NotAllowed(msg.sender);
            if (block.timestamp < e.refundAfter) revert RefundNotYet(jobId, e.refundAfter);
            if (block.timestamp < e.lockedUntil) revert EscrowLocked(jobId, e.lockedUntil);
        }
        refunded = e.amount - e.paid;
        e.closed = true;
        e.refunded = refunded;
        totalHeld -= refunded;
        if (refunded > 0) IERC20(address(token)).safeTransfer(owner, refunded);
        emit Closed(jobId, msg.sender, refunded);
    }
}
