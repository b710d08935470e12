// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";

/// @title ModelRegistry: trained models by the sha256 of their checkpoint.
/// @notice A model is published once per checkpoint hash, by its owner or by
/// the orchestrator on the owner's behalf; the owner or the orchestrator then
/// deploys it (miners serve it) or undeploys it.
contract ModelRegistry is AccessControl {
    bytes32 public constant ORCHESTRATOR_ROLE = keccak256("ORCHESTRATOR_ROLE");

    struct Model {
        bytes32 checkpointSha256;
        string name;
        string metadataURI;
        address owner;
        uint256 pricePer1kTokens;
        bool deployed;
        uint64 publishedAt;
    }

    Model[] private _models;
    /// checkpoint hash => model id + 1 (0: not published)
    mapping(bytes32 => uint256) private _idPlusOne;

    event ModelPublished(
        uint256 indexed modelId,
        bytes32 indexed checkpointSha256,
        address indexed owner,
        string name,
        string metadataURI,
        uint256 pricePer1kTokens
    );
    event ModelDeployed(uint256 indexed modelId, address by);
    event ModelUndeployed(uint256 indexed modelId, address by);

    error AlreadyPublished(bytes32 checkpointSha256, uint256 modelId);
    error UnknownModel(uint256 modelId);
    error NotAllowed(address caller);
    error EmptyName();
    error ZeroHash();
    error ZeroAddress();
    error AlreadyInState(uint256 modelId, bool deployed);

    constructor(address admin, address orchestrator) {
        _grantRole(DEFAULT_ADMIN_ROLE, admin);
        _grantRole(ORCHESTRATOR_ROLE, orchestrator);
    }

    function publish(
        bytes32 checkpointSha256,
        string calldata name,
        string calldata metadataURI,
        address owner,
        uint256 pricePer1kTokens
    ) external returns (uint256 modelId) {
        if (checkpointSha256 == bytes32(0)) revert ZeroHash();
        if (bytes(name).length == 0) revert EmptyName();
        if (owner == address(0)) revert ZeroAddress();
        if (msg.sender != owner && !hasRole(ORCHESTRATOR_ROLE, msg.sender)) revert NotAllowed(msg.sender);
        uint256 existing = _idPlusOne[checkpointSha256];
        if (existing != 0) revert AlreadyPublished(checkpointSha256, existing - 1);
        modelId = _models.length;
        _models.push(
            Model(checkpointSha256, name, metadataURI, owner, pricePer1kTokens, false, uint64(block.timestamp))
        );
        _idPlusOne[checkpointSha256] = modelId + 1;
        emit ModelPublished(modelId, checkpointSha256, owner, name, metadataURI, pricePer1kTokens);
    }

    function deploy(uint256 modelId) external {
        _setDeployed(modelId, true);
        emit ModelDeployed(modelId, msg.sender);
    }

    function undeploy(uint256 modelId) external {
        _setDeployed(modelId, false);
        emit ModelUndeployed(modelId, msg.sender);
    }

    function modelCount() external view returns (uint256) {
        return _models.length;
    }

    function getModel(uint256 modelId) external view returns (Model memory) {
        if (modelId >= _models.length) revert UnknownModel(modelId);
        return _models[modelId];
    }

    function modelIdOf(bytes32 checkpointSha256) external view returns (bool found, uint256 modelId) {
        uint256 idPlusOne = _idPlusOne[checkpointSha256];
        return idPlusOne == 0 ? (false, 0) : (true, idPlusOne - 1);
    }

    /// Models [offset, offset + limit), clipped to the list.
    function listModels(uint256 offset, uint256 limit) external view returns (Model[] memory page) {
        uint256 n = _models.length;
        uint256 end = offset >= n ? offset : (limit > n - offset ? n : offset + limit);
        page = new Model[](end > offset ? end - offset : 0);
        for (uint256 i = offset; i < end; ++i) page[i - offset] = _models[i];
    }

    function _setDeployed(uint256 modelId, bool deployed) private {
        if (modelId >= _models.length) revert UnknownModel(modelId);
        Model storage m = _models[modelId];
        if (msg.sender != m.owner && !hasRole(ORCHESTRATOR_ROLE, msg.sender)) revert NotAllowed(msg.sender);
        if (m.deployed == deployed) revert AlreadyInState(modelId, deployed);
        m.deployed = deployed;
    }
}
