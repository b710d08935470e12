// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";
import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";
import {NIM} from "./NIM.sol";

/// @title Staking: miners lock NIM to take part; the orchestrator can slash it.
/// @notice stake -> unstake (starts a cooldown) -> withdraw (after the cooldown).
/// The RewardDistributor credits epoch rewards directly as stake.
/// Invariant: token.balanceOf(this) == totalStaked + totalUnstaking.
/// A slash names its offence: the same orchestrator account cannot slash the
/// same offence twice, so a slash resent after a lost receipt, an RPC error or
/// a restart is refused by the chain itself.
contract Staking is AccessControl {
    using SafeERC20 for IERC20;

    bytes32 public constant ORCHESTRATOR_ROLE = keccak256("ORCHESTRATOR_ROLE");
    bytes32 public constant DISTRIBUTOR_ROLE = keccak256("DISTRIBUTOR_ROLE");

    struct Unstaking {
        uint192 amount;
        uint64 releaseAt;
    }

    NIM public immutable token;
    /// Seconds between unstake and withdraw.
    uint64 public cooldown;
    mapping(address => uint256) public stakeOf;
    mapping(address => Unstaking) public unstakingOf;
    uint256 public totalStaked;
    uint256 public totalUnstaking;
    /// offenceSlashed[orchestrator][offence]: that orchestrator account slashed for that offence already.
    mapping(address => mapping(bytes32 => bool)) public offenceSlashed;

    event Staked(address indexed account, uint256 amount);
    event UnstakeRequested(address indexed account, uint256 amount, uint64 releaseAt);
    event Withdrawn(address indexed account, uint256 amount);
    event Slashed(address indexed account, uint256 amount, string reason);
    event CooldownChanged(uint64 cooldown);

    error ZeroAmount();
    error InsufficientStake(uint256 available, uint256 requested);
    error NothingToWithdraw();
    error CooldownNotOver(uint64 releaseAt);
    error LengthMismatch();
    error CreditTotalMismatch(uint256 expected, uint256 actual);
    error OffenceAlreadySlashed(bytes32 offence);

    constructor(NIM token_, address admin, address orchestrator, uint64 cooldown_) {
        token = token_;
        cooldown = cooldown_;
        _grantRole(DEFAULT_ADMIN_ROLE, admin);
        _grantRole(ORCHESTRATOR_ROLE, orchestrator);
        emit CooldownChanged(cooldown_);
    }

    function setCooldown(uint64 cooldown_) external onlyRole(DEFAULT_ADMIN_ROLE) {
        cooldown = cooldown_;
        emit CooldownChanged(cooldown_);
    }

    /// Locks `amount` of the caller's NIM (needs an ERC-20 approval first).
    function stake(uint256 amount) external {
        if (amount == 0) revert ZeroAmount();
        IERC20(address(token)).safeTransferFrom(msg.sender, address(this), amount);
        stakeOf[msg.sender] += amount;
        totalStaked += amount;
        emit Staked(msg.sender, amount);
    }

    /// Moves `amount` of the caller's stake to unstaking; it can be withdrawn
    /// `cooldown` seconds later. A new request restarts the cooldown of what
    /// is already unstaking.
    function unstake(uint256 amount) external {
        if (amount == 0) revert ZeroAmount();
        uint256 staked = stakeOf[msg.sender];
        if (amount > staked) revert InsufficientStake(staked, amount);
        stakeOf[msg.sender] = staked - amount;
        totalStaked -= amount;
        Unstaking storage u = unstakingOf[msg.sender];
        uint64 releaseAt = uint64(block.timestamp) + cooldown;
        u.amount += SafeCast.toUint192(amount);
        u.releaseAt = releaseAt;
        totalUnstaking += amount;
        emit UnstakeRequested(msg.sender, amount, releaseAt);
    }

    /// Sends the caller's unstaked tokens back once the cooldown is over.
    function withdraw() external returns (uint256 amount) {
        Unstaking memory u = unstakingOf[msg.sender];
        if (u.amount == 0) revert NothingToWithdraw();
        if (block.timestamp < u.releaseAt) revert CooldownNotOver(u.releaseAt);
        amount = u.amount;
        delete unstakingOf[msg.sender];
        totalUnstaking -= amount;
        IERC20(address(token)).safeTransfer(msg.sender, amount);
        emit Withdrawn(msg.sender, amount);
    }

    /// Burns `amount` of `account`'s stake (then of its unstaking tokens, so a
    /// pending unstake does not escape a slash), once per `offence` of the
    /// calling orchestrator account. Orchestrator only.
    function slash(address account, uint256 amount, bytes32 offence, string calldata reason)
        external
        onlyRole(ORCHESTRATOR_ROLE)
    {
        if (amount == 0) revert ZeroAmount();
        if (offenceSlashed[msg.sender][offence]) revert OffenceAlreadySlashed(offence);
        offenceSlashed[msg.sender][offence] = true;
        uint256 staked = stakeOf[account];
        Unstaking storage u = unstakingOf[account];
        uint256 available = staked + u.amount;
        if (amount > available) revert InsufficientStake(available, amount);
        uint256 fromStake = amount <= staked ? amount : staked;
        uint256 fromUnstaking = amount - fromStake;
        stakeOf[account] = staked - fromStake;
        totalStaked -= fromStake;
        if (fromUnstaking > 0) {
            u.amount -= SafeCast.toUint192(fromUnstaking);
            totalUnstaking -= fromUnstaking;
        }
        token.burn(amount);
        emit Slashed(account, amount, reason);
    }

    /// Adds rewards to stakes. The caller (the RewardDistributor) has already
    /// minted `total` tokens to this contract. Distributor only.
    function creditStakes(address[] calldata accounts, uint256[] calldata amounts, uint256 total)
        external
        onlyRole(DISTRIBUTOR_ROLE)
    {
        uint256 n = accounts.length;
        if (n != amounts.length) revert LengthMismatch();
        uint256 sum = 0;
        for (uint256 i = 0; i < n; ++i) {
            uint256 a = amounts[i];
            stakeOf[accounts[i]] += a;
            sum += a;
        }
        if (sum != total) revert CreditTotalMismatch(total, sum);
        totalStaked += sum;
    }
}
