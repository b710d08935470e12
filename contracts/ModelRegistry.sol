// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";

/// @title ModelRegistry: trained models by the sha256 of their checkpoint.
/// @notice A model is published once per checkpoint hash, by the orchestrator
/// on the owner's behalf, or by the owner with the orchestrator's attestation:
/// an EIP-712 signature by an ORCHESTRATOR_ROLE account over the checkpoint
/// hash, the owner, name, metadata URI, price and a deadline. The orchestrator
/// signs it only for the developer whose job produced the weights (or who
/// first stored them), so a copy of a pending publish seen in the mempool
/// cannot be published under another owner. The owner or the orchestrator then
/// deploys it (miners serve it) or undeploys it.
/// A name belongs to the first owner to publish under it: later models of that
/// owner may carry it (new versions), another owner's publish is refused
/// (NameTaken), so a name a caller asks for resolves to one owner.
contract ModelRegistry is AccessControl, EIP712 {
    bytes32 public constant ORCHESTRATOR_ROLE = keccak256("ORCHESTRATOR_ROLE");
    bytes32 public constant PUBLISH_TYPEHASH = keccak256(
        "PublishAttestation(bytes32 checkpointSha256,address owner,string name,string metadataURI,uint256 pricePer1kTokens,uint256 deadline)"
    );

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
    /// keccak256(name) => the owner who first published under it
    mapping(bytes32 => address) private _nameOwner;

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
    error MissingAttestation();
    error AttestationExpired(uint256 deadline);
    error InvalidAttestation(address signer);
    error NameTaken(string name, address owner);

    constructor(address admin, address orchestrator) EIP712("Nimble ModelRegistry", "1") {
        _grantRole(DEFAULT_ADMIN_ROLE, admin);
        _grantRole(ORCHESTRATOR_ROLE, orchestrator);
    }

    /// Publishes a checkpoint for `owner`. An ORCHESTRATOR_ROLE caller needs no
    /// attestation (`deadline` and `attestation` are ignored); any other caller
    /// must be `owner` and carry the orchestrator's signature over exactly these
    /// arguments, valid until `deadline` (unix seconds, inclusive).
    function publish(
        bytes32 checkpointSha256,
        string calldata name,
        string calldata metadataURI,
        address owner,
        uint256 pricePer1kTokens,
        uint256 deadline,
        bytes calldata attestation
    ) external returns (uint256 modelId) {
        if (checkpointSha256 == bytes32(0)) revert ZeroHash();
        if (bytes(name).length == 0) revert EmptyName();
        if (owner == address(0)) revert ZeroAddress();
        if (!hasRole(ORCHESTRATOR_ROLE, msg.sender)) {
            if (msg.sender != owner) revert NotAllowed(msg.sender);
            if (attestation.length == 0) revert MissingAttestation();
            if (block.timestamp > deadline) revert AttestationExpired(deadline);
            bytes32 digest = publishAttestationDigest(checkpointSha256, owner, name, metadataURI, pricePer1kTokens, deadline);
            (address signer, ECDSA.RecoverError err,) = ECDSA.tryRecoverCalldata(digest, attestation);
            if (err != ECDSA.RecoverError.NoError || !hasRole(ORCHESTRATOR_ROLE, signer)) revert InvalidAttestation(signer);
        }
        uint256 existing = _idPlusOne[checkpointSha256];
        if (existing != 0) revert AlreadyPublished(checkpointSha256, existing - 1);
        _claimName(name, owner);
        modelId = _models.length;
        _models.push(
            Model(checkpointSha256, name, metadataURI, owner, pricePer1kTokens, false, uint64(block.timestamp))
        );
        _idPlusOne[checkpointSha256] = modelId + 1;
        emit ModelPublished(modelId, checkpointSha256, owner, name, metadataURI, pricePer1kTokens);
    }

    /// The EIP-712 digest an orchestrator signs to let `owner` publish this checkpoint.
    function publishAttestationDigest(
        bytes32 checkpointSha256,
        address owner,
        string calldata name,
        string calldata metadataURI,
        uint256 pricePer1kTokens,
        uint256 deadline
    ) public view returns (bytes32) {
        return _hashTypedDataV4(
            keccak256(
                abi.encode(
                    PUBLISH_TYPEHASH,
                    checkpointSha256,
                    owner,
                    keccak256(bytes(name)),
                    keccak256(bytes(metadataURI)),
                    pricePer1kTokens,
                    deadline
                )
            )
        );
    }

    function deploy(uint256 modelId) external {
        _setDeployed(modelId, true);
        emit ModelDeployed(modelId, msg.sender);
    }

    function undeploy(uint256 modelId) external {
        _setDeployed(modelId, false);
        emit ModelUndeployed(modelId, msg.sender);
    }

    /// The owner of `name` (the first to publish under it; zero: nobody yet).
    function nameOwner(string calldata name) external view returns (address) {
        return _nameOwner[keccak256(bytes(name))];
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

    /// `name` becomes `owner`'s if nobody has it; another owner's name is refused.
    function _claimName(string calldata name, address owner) private {
        bytes32 key = keccak256(bytes(name));
        address holder = _nameOwner[key];
        if (holder == address(0)) _nameOwner[key] = owner;
        else if (holder != owner) revert NameTaken(name, holder);
    }

    function _setDeployed(uint256 modelId, bool deployed) private {
        if (modelId >= _models.length) revert UnknownModel(modelId);
        Model storage m = _models[modelId];
        if (msg.sender != m.owner && !hasRole(ORCHESTRATOR_ROLE, msg.sender)) revert NotAllowed(msg.sender);
        if (m.deployed == deployed) revert AlreadyInState(modelId, deployed);
        m.deployed = deployed;
    }
}
