"""The SAE-V page: which SAE (ours, trained here, or one sae-lens saved) on which data, its feature store
(the one run), then a view of it: the feature list, a feature's page (permalink ?feature=K), explain an
input, data ranking and filtering, steering. Any SAE: ours, or one saved by sae-lens.

Controls: SaeChoice's settings (the feature store's size); view state: SaeState (analysis/sae_v/params.py).
Every step that runs the model goes through the shared runner (page.run); components/sae/ draws results."""
from __future__ import annotations

import dataclasses

import streamlit as st

from analysis import sae_v
from analysis.framework.errors import UserError
from components import hosting  # uploads under the deployment's limits
from components.common import analysis_errors, demo_model, field_row, show_error
from components.figures import sae as figs
from components.model_picker import try_load
from components.params_form import ParamsForm, fields_of
from components.sae import browse, explained, ranked, steered
from components.share import share_bar
from components.view import Page, Section, View

OWN = "own"  # the data choice "the SAE's own evaluation pairs" (URL: no `data`)
SHOWN_KEY = "_sae_shown_for"  # (model, name) of the last SAE of a model's own this page showed


@st.cache_resource(max_entries=4, show_spinner="Loading the feature store ...")
def load_feature_store(folder: str, stamp: float):
    return sae_v.load_store(folder)


@st.cache_data(max_entries=32, show_spinner=False)
def pair_image(store_key: str, _store: sae_v.FeatureStore, pair: int, size: int):
    try:
        image = sae_v.pair_image(_store.pairs, pair)
    except UserError:
        return None
    return None if image is None else figs.fit_image(image, size)


def _describe(folders: dict, name: str) -> str:
    folder = folders.get(name)
    if folder is None:
        return f"{name} (from elsewhere: sae-lens)"
    try:
        meta = sae_v.SaeMeta.from_json((folder / sae_v.META_FILE).read_text())
    except (OSError, ValueError):
        return folder.name
    where = "demo" if sae_v.SAE_ROOT in folder.parents else "trained here"
    return f"layer {meta.layer} · {meta.kind} · {meta.train.d_sae if meta.train else '?'} features · " \
           f"FVE {meta.fve:.3f} · {where}"


class SaeView(View):
    panel = "sae"
    prefix = "sae_"
    intro_caption = ("Sparse-autoencoder features over the image and text tokens of a multimodal model (or the text "
                     "tokens of a language model), their cross-modal weight ω, data filtering by cross-modal score, "
                     "and steering — after *SAE-V* (ICML 2025).")
    sections = (Section(None),)  # the feature store's size, under the data it is built on

    # --- controls: which SAE, which data ------------------------------------------------------------

    def controls(self, page: Page) -> sae_v.SaeChoice:
        handle = page.handle
        self.page, self.handle, self.is_vlm = page, handle, handle.kind == "vlm"
        self.suggest_demo_vlm()
        self.folders = folders = {f.name: f for f in sae_v.available_saes(handle)}
        self.train_form(bool(folders))
        self.outside_form()
        first = next(iter(folders), "")
        linked = page.link_value("sae").strip()
        if linked and linked not in folders and st.session_state.get(SHOWN_KEY, (handle.spec, ""))[1] == linked \
                and st.session_state[SHOWN_KEY][0] != handle.spec:
            linked = ""  # the SAE of the model shown before (the demo VLM's, until the visitor took theirs back)
        options = list(folders) + ([linked] if linked and linked not in folders else [])
        if not options:
            st.info("There is no SAE for this model yet: train one above, or use one from elsewhere.")
            st.stop()
        self.sae_name = name = page.control("sae", choices=options, default=linked or first, key="pick",
                                            format_func=lambda n: _describe(folders, n))
        if name in folders:
            st.session_state[SHOWN_KEY] = (handle.spec, name)
        # an outside SAE whose cfg names no hook: the layer its link gives (set by the form above)
        self.outside_layer = page.link_value("slayer", high=handle.info.layers - 1) if name not in folders else -1
        self.own_data_form()
        choices = self.data_choices(page.link_value("data"))
        data = page.control("data", choices=choices, default=OWN if OWN in choices else choices[0],
                            format_func=self.data_label)
        self.data = "" if data == OWN else data
        page.set_link(data=self.data)
        with st.expander("Feature store settings (for data other than the SAE's own)"):
            page.draw_sections(self.sections)
        try:
            self.base = sae_v.choose(handle, name, self.data, layer=self.outside_layer)
            if name not in folders:
                sae_v.open_sae(handle, self.base)  # an outside SAE: checked against the model before anything runs
        except UserError as exc:
            show_error(exc, prefix="This SAE or these data cannot be used: ")
            st.caption("Choose another SAE or other data above (the link's values were refused).")
            st.stop()
        return self.params_of(page, page.form.values)

    def params_of(self, page: Page, values: dict) -> sae_v.SaeChoice:
        return dataclasses.replace(self.base, **values)

    def suggest_demo_vlm(self) -> None:
        demo_vlm = None if self.is_vlm else demo_model("vlm")
        if demo_vlm is not None:
            c1, c2 = st.columns([4, 1])
            c1.info(f"{self.handle.spec.label} is a text-only model: its SAE features are text features (no modality "
                    "columns, no image–caption ranking). The demo vision-language model has a trained SAE ready.")
            if c2.button(f"Use {demo_vlm.label}", key="sae_use_demo"):
                if try_load(demo_vlm) is not None:
                    st.rerun()

    def train_form(self, has_saes: bool) -> None:
        handle = self.handle
        with st.expander(":material/model_training: Train a new SAE" + ("" if has_saes else " (none yet for this model)"),
                         expanded=not has_saes):
            st.caption("Collects the residual stream after the chosen decoder layer over image and text tokens, "
                       "trains an sae-lens SAE, then builds the feature store the browser reads. On the demo model "
                       "this takes about a minute on CPU.")
            form = ParamsForm("sae_train_", link=False)  # a training run is not a view: not in the link
            row = field_row()
            values = form.draw(row, fields_of(sae_v.BuildParams, ["layer"]), defaults={"layer": handle.info.layers // 2})
            values |= form.draw(row, fields_of(sae_v.TrainParams, ["architecture", "d_sae", "steps"]),
                                defaults={"d_sae": 512}, overrides={"architecture": {"format_func": str}})
            values |= form.draw(row, sae_v.ARCHITECTURES.settings())
            if st.button("Train SAE", key="sae_train_go", type="primary"):
                flat = {k: v for k, v in values.items() if k in ("k", "l1_coefficient", "l0_coefficient")}
                train = sae_v.TrainParams(architecture=values["architecture"], d_sae=int(values["d_sae"]),
                                          steps=int(values["steps"]), architectures=sae_v.architecture_settings(**flat))
                with analysis_errors(prefix="Training failed: "):
                    params = sae_v.BuildParams(layer=int(values["layer"]), train=train)
                    params.validate()
                    trained = self.page.run("train", sae_v.train, params, label="Training the SAE")
                self.page.set_link(sae=trained.name, view="list")
                st.session_state.pop("sae_pick", None)
                st.rerun()

    def outside_form(self) -> None:
        handle = self.handle
        if not {"local", "hub"} & set(hosting.settings().models.sources):
            return  # an instance that reads no server folder and fetches nothing: no SAE can come from elsewhere
        with st.expander(":material/upload_file: Use an SAE from elsewhere (saved by sae-lens)"):
            st.caption("A folder on this server under the allowed roots with sae-lens's `cfg.json` and "
                       "`sae_weights.safetensors` (`SAE.save_model` / `save_inference_model`), or "
                       "`sae-lens:RELEASE/SAE_ID` for a pretrained release (needs the machine online). It is checked "
                       "against this model (its hook and width) before anything runs.")
            c1, c2 = st.columns([4, 1])
            where = c1.text_input("SAE folder or sae-lens:RELEASE/SAE_ID", key="sae_outside_path", max_chars=500)
            layer = c2.number_input("Layer (only if its cfg names no hook)", -1, handle.info.layers - 1, -1,
                                    key="sae_outside_layer")
            if st.button("Use this SAE", key="sae_outside_go") and where.strip():
                try:
                    source = sae_v.locate(handle, where.strip())
                    sae_v.open_sae(handle, sae_v.SaeChoice(sae=source.locator, layer=int(layer),
                                                           sae_fingerprint=sae_v.sae_fingerprint(source)))
                except UserError as exc:
                    show_error(exc)
                else:
                    self.page.set_link(sae=source.locator, slayer=int(layer), view="list")
                    st.session_state.pop("sae_pick", None)
                    st.rerun()

    def data_choices(self, current: str) -> list[str]:
        """The SAE's own pairs (ours) or the model's default generated pairs first, then the others, then yours."""
        first = sae_v.default_dataset(self.handle)
        generated = [f"dataset:{name}" for name in sorted(sae_v.DATASETS, key=lambda n: n != first)]
        out = ([OWN] if self.sae_name in self.folders else []) + generated
        return out + ([current] if current and current not in out else [])

    @staticmethod
    def data_label(value: str) -> str:
        if value == OWN:
            return "The SAE's own evaluation pairs"
        if value.startswith("dataset:"):
            return f"Generated: {sae_v.DATASETS.label(value.partition(':')[2])}"
        shown = value.removeprefix("upload:")[:12] + " (uploaded zip)" if value.startswith("upload:") else value
        return f"Your data: {shown}"

    def own_data_form(self) -> None:
        handle = self.handle
        with st.expander(":material/dataset: Your own data (a folder or a zip)"):
            st.caption("A folder with `captions.jsonl` (`{\"image\": \"a.png\", \"caption\": \"...\"}` per line), "
                       "`captions.csv` (image,caption), a Parquet file or a `datasets` folder (`save_to_disk`) with "
                       "an image and a caption column — for a language model `texts.txt` or `texts.jsonl`. A `label` "
                       "or `corrupted` column adds ROC, precision and recall. Bad rows are reported and left out.")
            c1, c2 = st.columns([3, 2])
            server_folders = "local" in hosting.settings().models.sources  # a public instance reads none
            path = c1.text_input("Folder on this server (under the allowed roots)", key="sae_data_path",
                                 max_chars=500) if server_folders else ""
            if server_folders and c1.button("Use this folder", key="sae_data_go") and path.strip():
                with analysis_errors(stop=False):
                    sae_v.userdata.load(path.strip(), handle.kind)
                    self.page.set_link(data=path.strip())
                    st.session_state.pop("sae_data", None)  # the picker then starts from the link
                    st.rerun()
            upload = hosting.file_uploader("…or upload a zip", key="sae_data_zip", kind="zip", where=c2)
            if upload is not None and c2.button("Use this zip", key="sae_data_zip_go"):
                with analysis_errors(stop=False):
                    locator = sae_v.save_zip(upload.getvalue(), name=f"'{upload.name}'", owner=hosting.upload_owner())
                    sae_v.userdata.load(locator, handle.kind)
                    self.page.set_link(data=locator)
                    st.session_state.pop("sae_data", None)
                    st.rerun()

    # --- the run: the feature store -------------------------------------------------------------------

    def run(self, page: Page, choice: sae_v.SaeChoice) -> sae_v.FeatureStore:
        self.choice = choice
        if self.sae_name in self.folders and not self.data:
            folder = self.folders[self.sae_name]
            return load_feature_store(str(folder), (folder / sae_v.STORE_FILE).stat().st_mtime)
        return page.run("store", sae_v.store_for, choice, label="Building the feature store on these data")

    # --- the views of it ------------------------------------------------------------------------------

    def show(self, page: Page, choice: sae_v.SaeChoice, store: sae_v.FeatureStore) -> None:
        self.store, self.store_key = store, choice.to_json()
        if sae_v.is_stale(self.handle, store.meta):
            st.warning("This SAE was trained on different weights of this model (the model was rebuilt since). Its "
                       "features may no longer match: train a new SAE above.")
        # a feature permalink (?feature=K) without a view opens the feature page
        default = "feature" if page.link_value("feature", default=None) is not None else "list"
        view = page.control("view", page.headline_choice, default=default, key="view", width="content") or "list"
        {"list": self.show_list, "feature": self.show_feature, "explain": self.show_explain,
         "ranking": self.show_ranking}[view]()

    def image_of(self, pair: int):
        return (pair_image(self.store_key, self.store, pair, self.handle.info.image_size or 64)
                if self.is_vlm else None)

    def steer_section(self, default: str, image_ref: str, where: str) -> None:
        page, store = self.page, self.store
        st.markdown("#### Steer: add features while the model generates")
        output = st.container()  # the two outputs above their controls: the finding first
        row = field_row()
        text = page.control("steer", row, default=default, key=f"steer_{where}")
        values = {"mode": page.control("mode", row, key=f"steer_{where}_mode", width=135)}
        if self.is_vlm:
            values["positions"] = page.control("at", row, key=f"steer_{where}_positions", width=135)
        values["max_new_tokens"] = page.control("tokens", row, key=f"steer_{where}_max_new_tokens", width=135)
        first = store.pairs.pairs[0].text.split()[:4] if store.pairs.pairs and not self.is_vlm else []
        values["prompt"] = page.control("sprompt", default=" ".join(first), key=f"steer_{where}_prompt")
        with analysis_errors():
            features = sae_v.parse_steer([t for t in text.replace(" ", "").split(",") if t])
            params = sae_v.choose(self.handle, self.sae_name, self.choice.data, sae_v.SteerParams,
                                  layer=self.outside_layer, features=features, image=image_ref, **values)
            params.validate()
        result = page.run("steer", sae_v.steer, params, label="Generating with and without steering", on_demand=True)
        if result is not None:  # None: not run yet (its button is shown)
            with output:
                steered.side_by_side(result)

    def show_list(self) -> None:
        page, store = self.page, self.store
        with page.headline:  # the finding first: the SAE's numbers and its feature list
            self.feature_list()
        if not browse.one_modality(store):
            browse.scatter(store)

    def feature_list(self) -> None:
        page, store = self.page, self.store
        browse.summary(store)
        c1, c2 = st.columns([1, 2])
        sort_by = page.control("sort", c1)
        kinds = list(figs.LABEL_COLOURS)
        labels = kinds
        if not browse.one_modality(store):  # one-click toggles mirrored in the URL (labels=none when every one is off)
            labels = page.control("labels", c2, choices=kinds)
            labels = [k for k in kinds if k in labels]
        rows = figs.sort_rows(figs.feature_rows(store), sort_by, labels)
        if not labels:
            st.info("Choose at least one modality label to list its features.")
        elif not rows:
            st.info(f"No feature of this SAE is {' or '.join(labels)}.")
        else:
            browse.table(store, rows)
        c1, c2 = st.columns([1, 3])
        pick = c1.number_input("Open feature", 0, len(store.features) - 1, int(rows[0]["feature"]) if rows else 0,
                               key="sae_open_pick")
        if c2.button("Open feature page", key="sae_open"):
            page.set_link(view="feature", feature=int(pick))
            st.session_state.pop("sae_view", None)
            st.rerun()

    def show_feature(self) -> None:
        page, store, handle = self.page, self.store, self.handle
        n_features = len(store.features)
        index = page.control("feature", page.headline_controls, high=n_features - 1, width="stretch")
        asked = page.state.raw.get("feature", index)
        if asked != index:
            page.headline.error(f"Feature {asked} does not exist: this SAE has features 0 to {n_features - 1}.")
        card = store.features[index]
        steering = page.preset is not None and page.preset.name.startswith("steer")
        strength = round(max(2 * card.max_act, 1.0), 1)
        pair = 0
        if steering:  # its finding is the caption that moves: the steering first, the feature's page under it
            with page.headline:
                if self.is_vlm:
                    pair = page.link_value("spair", high=max(len(store.pairs.pairs) - 1, 0))
                self.steer_section(f"{index}={strength:g}", f"pair:{pair}" if self.is_vlm else "", "feature")
                if self.is_vlm:  # under the steering's own controls
                    page.control("spair", high=max(len(store.pairs.pairs) - 1, 0), key="steer_pair")
            browse.feature_header(store, index)
        else:
            with page.headline:
                browse.feature_header(store, index)
        browse.feature_text(store, card)
        if self.is_vlm and store.grid:
            browse.feature_images(store, card, self.image_of, handle.info.image_size or 64)
        browse.feature_tables(store, card)
        if steering:
            return
        if self.is_vlm:
            pair = page.control("spair", high=max(len(store.pairs.pairs) - 1, 0), key="steer_pair")
        self.steer_section(f"{index}={strength:g}", f"pair:{pair}" if self.is_vlm else "", "feature")

    def show_explain(self) -> None:
        page, store, handle = self.page, self.store, self.handle
        image_ref, image = "", None
        pairs = store.pairs.pairs
        default_text = pairs[0].text if pairs else ""
        if self.is_vlm:
            source = st.radio("Image", ["Dataset scene", "Upload"], horizontal=True, key="sae_img_source")
            if source == "Dataset scene":
                i = page.control("img", high=max(len(pairs) - 1, 0), key="img_pair")
                image_ref, image, default_text = f"pair:{i}", self.image_of(i), pairs[i].text if pairs else ""
            else:
                upload = hosting.file_uploader("Upload an image", key="sae_upload")
                if upload is None:
                    st.info("Choose an image file to explain.")
                    return
                with analysis_errors():
                    image_ref = sae_v.save_image(upload.getvalue(), name=f"'{upload.name}'", owner=hosting.upload_owner())
                    image = figs.fit_image(sae_v.userdata.image_from_ref(image_ref), handle.info.image_size or 64)
        text = st.text_input("Text", value=default_text, max_chars=500, key="sae_text")
        if not text.strip():
            st.error("Enter some text to explain.")
            return
        with analysis_errors():
            params = sae_v.choose(handle, self.sae_name, self.choice.data, sae_v.ExplainParams,
                                  layer=self.outside_layer, text=text, image=image_ref)
        result = page.run("explain", sae_v.explain, params, label="Running the model on this input")
        if not result.totals:
            st.warning("No feature is active on this input.")
            return
        left, right = page.headline.columns([2, 3])  # the finding first: what this input activates
        if self.is_vlm and image is not None:
            with left:
                explained.image_side(result, store, image)
        with right if self.is_vlm else left:
            explained.text_side(result, store, image)
        top = ",".join(f"{s.key}={max(2 * s.value, 1.0):.1f}" for s in result.totals[:1])
        self.steer_section(top, image_ref, "explain")

    def show_ranking(self) -> None:
        page, store, handle, choice = self.page, self.store, self.handle, self.choice
        refusal = sae_v.rank_refusal(handle)  # the command line refuses in the same words
        if refusal:
            st.error(refusal)
            return
        stored_rule = store.params.score_rule if store.params is not None else "official"
        rule = page.control("rule", default=stored_rule, key="rank_rule", format_func=sae_v.SCORE_RULES.label)
        row = field_row(gap="large")
        by = page.control("by", row, key="rank_by", format_func={
            "sum": sae_v.score_label(rule), "weighted": "activation-weighted mean ω"}.get)
        # a widget per rule: each starts from the rule's own default
        threshold = page.control("thr", row, default=sae_v.score_rule(rule).cooccur_threshold,
                                 key=f"rank_{rule}_cooccur_threshold", width=135)
        keep = page.control("keep", key="rank_keep")
        with analysis_errors():
            params = sae_v.choose(handle, self.sae_name, choice.data, sae_v.RankParams, layer=self.outside_layer,
                                  rule=rule, by=by, rules=sae_v.rule_settings(cooccur_threshold=threshold))
        ranking = page.run("rank", sae_v.rank, params, label="Scoring every pair")
        with page.headline:  # the finding first: how the kinds of pair rank
            ranked.overview(ranking, store)
            figures = ranked.distribution(ranking)
        keep_fig = ranked.keep_section(ranking, keep)
        user_data = bool(choice.data) and not choice.data.startswith("dataset:")
        ranked.extremes(ranking, self._user_image if user_data else (lambda r: self.image_of(r.pair)))
        kept = (lambda: sae_v.kept_subset(choice.data, ranking, keep, handle.kind)) if user_data else None
        rows = ranked.downloads(ranking, keep, kept)
        if not choice.data:
            ranked.filtering_experiment()
        share_bar("sae", title=f"SAE-V ranking on {handle.spec.label} layer {store.meta.layer}",
                  params={"sae": self.sae_name, "data": choice.data, "by": by, "threshold": ranking.threshold,
                          "rule": rule, "keep": keep}, result=ranking, model=handle.spec.label,
                  figures={**figures, **({"Keep": keep_fig} if keep_fig is not None else {})}, tables={"ranking": rows})

    def _user_image(self, row: sae_v.PairScore):
        pairs, _, _ = sae_v.data_pairs(self.handle, self.choice)
        try:
            return figs.fit_image(sae_v.pair_image(pairs, row.pair), self.handle.info.image_size or 64)
        except UserError:
            return None
