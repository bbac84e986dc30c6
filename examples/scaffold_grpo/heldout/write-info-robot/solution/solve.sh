#!/bin/bash
echo robot > /workspace/info.txt
